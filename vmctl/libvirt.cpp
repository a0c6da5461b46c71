// The libvirt adapter: the C API behind the Hypervisor interface (CONTRACT §5).
//
// Threads. Calls come from the daemon's worker threads, several at once (a listing and the
// terminations of a reclaim), and libvirt's callbacks from its event-loop thread. A virConnectPtr
// is safe for concurrent calls, so every call runs on its own reference to the current connection,
// taken under the adapter's mutex and used without it: the mutex is never held across a libvirt
// call, and a slow listing holds back no termination (nor the other way round). What the mutex
// guards, and which threads touch it, is listed at Libvirt's members.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include "gpunode/vmctl/vmctl.hpp"
#include "libvirt_api.hpp"

namespace gpunode::vmctl {
namespace {

// libvirt's functions, once loaded: called only where libvirt_api() succeeded (the adapter's
// constructor checks, and every call goes through open(), which refuses without it).
const detail::LibvirtApi& lv() {
  return *detail::libvirt_api();
}

void ignore_error(void* /*user_data*/, virErrorPtr /*error*/) {}

// Once per process: initialise libvirt before any thread uses it and silence its default
// handler (which prints every error on stderr); errors are returned as VmError (from_libvirt) instead.
void init_libvirt() {
  static std::once_flag once;
  std::call_once(once, [] {
    lv().virInitialize();
    lv().virSetErrorFunc(nullptr, ignore_error);
  });
}

// Once per process: libvirt's default event loop, run by a thread of its own for the life of the
// process (lifecycle events, close callbacks and keepalive all need it). It must be registered
// before a connection is opened to take effect on that connection.
void start_event_loop() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (lv().virEventRegisterDefaultImpl() < 0) return;
    std::thread([] {
      while (lv().virEventRunDefaultImpl() == 0) {
      }
    }).detach();
  });
}

struct DomainFree {
  void operator()(virDomainPtr domain) const { lv().virDomainFree(domain); }
};
using DomainHandle = std::unique_ptr<std::remove_pointer_t<virDomainPtr>, DomainFree>;
using SharedDomain = std::shared_ptr<std::remove_pointer_t<virDomainPtr>>;

struct CFree {
  void operator()(char* text) const { std::free(text); }  // NOLINT: libvirt returns malloc'd strings
};
using CString = std::unique_ptr<char, CFree>;

// libvirt's last error (virGetLastError), mapped once (from_libvirt), then reset. `detail` is
// libvirt's message after `prefix`, or `otherwise` when it has none; no last error is code 0.
VmError last_error(std::string_view prefix, std::string_view otherwise) {
  virErrorPtr last = lv().virGetLastError();
  const int code = last != nullptr ? last->code : VIR_ERR_OK;
  std::string detail{prefix};
  detail += last != nullptr && last->message != nullptr ? std::string_view(last->message) : otherwise;
  lv().virResetLastError();
  return from_libvirt(code, std::move(detail));
}

// `e` as the hypervisor that cannot be reached: `unavailable`, whatever libvirt's code (kept in native).
VmError unreachable(VmError e) {
  e.code = error::Errc::unavailable;
  return e;
}

// The watchers of every adapter of the process, by id. libvirt's callbacks get the id as their
// opaque value, never a pointer: deregistering a callback does not wait for a run in progress
// (libvirt drops its own lock while it dispatches), and a driver without close callbacks (the test
// driver) accepts one and never frees its opaque, so a late callback finds no entry rather than
// freed memory. The mutex is held while a watcher runs, so set() returns only once a run of the
// function it replaces has finished, and that function never starts again. Nothing here calls
// into libvirt and the adapter never deregisters under this mutex, so a close callback (which
// libvirt runs holding its own close lock) waiting for it cannot deadlock. Never destroyed: the
// event-loop thread outlives static destructors.
class Watchers {
 public:
  static Watchers& get() {
    static auto* const all = new Watchers;  // NOLINT: leaked on purpose (see above)
    return *all;
  }
  std::uintptr_t make_id() {
    std::lock_guard lock{mu_};
    return next_id_++;
  }
  // Replaces the function of `id` (an empty one removes it).
  void set(std::uintptr_t id, std::function<void()> on_change) {
    std::function<void()> old;  // destroyed after the unlock
    std::lock_guard lock{mu_};
    if (auto it = by_id_.find(id); it != by_id_.end()) {
      old = std::move(it->second);
      by_id_.erase(it);
    }
    if (on_change) by_id_.emplace(id, std::move(on_change));
  }
  // On libvirt's event-loop thread.
  void notify(void* opaque) {
    std::lock_guard lock{mu_};
    if (auto it = by_id_.find(reinterpret_cast<std::uintptr_t>(opaque)); it != by_id_.end()) it->second();
  }

 private:
  std::mutex mu_;
  std::uintptr_t next_id_ = 1;
  std::map<std::uintptr_t, std::function<void()>> by_id_;
};

int on_lifecycle(virConnectPtr, virDomainPtr, int, int, void* opaque) {
  Watchers::get().notify(opaque);
  return 0;
}
void on_close(virConnectPtr, int, void* opaque) {
  Watchers::get().notify(opaque);
}

// One open connection, shared by the calls that use it: the last of them to let go closes it (and
// deregisters its callbacks), so a reconnect never closes a connection under a call in progress.
struct Connection {
  virConnectPtr ptr;
  int lifecycle_id = -1;
  bool close_registered = false;
  // Domain handles by uuid: a listing's, then any looked up since (a lookup is a round trip to
  // libvirtd, and a termination makes several calls on one domain). Guarded by Libvirt::mu_.
  std::map<std::string, SharedDomain> handles;

  explicit Connection(virConnectPtr conn) : ptr(conn) {}
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() {
    handles.clear();  // each holds a reference to the connection
    if (lifecycle_id >= 0) (void)lv().virConnectDomainEventDeregisterAny(ptr, lifecycle_id);
    if (close_registered) (void)lv().virConnectUnregisterCloseCallback(ptr, on_close);
    lv().virConnectClose(ptr);
    lv().virResetLastError();
  }
};
using ConnRef = std::shared_ptr<Connection>;

class Libvirt final : public Hypervisor {
 public:
  explicit Libvirt(std::string uri) : uri_(std::move(uri)) {
    if (detail::libvirt_api()) init_libvirt();
  }
  // Nothing else may call the adapter now. The watcher goes first: once it is gone no callback
  // runs it; then the connection closes with the members.
  ~Libvirt() override { Watchers::get().set(watcher_id_, {}); }
  Libvirt(const Libvirt&) = delete;
  Libvirt& operator=(const Libvirt&) = delete;

  std::expected<std::vector<Domain>, VmError> list() override {
    auto conn = connection();
    if (!conn) return std::unexpected(conn.error());
    virDomainPtr* raw = nullptr;
    const int n = lv().virConnectListAllDomains((*conn)->ptr, &raw, 0);
    if (n < 0) return std::unexpected(fail(*conn));
    std::vector<DomainHandle> handles;
    handles.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) handles.emplace_back(raw[i]);
    std::free(raw);  // NOLINT: the array is malloc'd by libvirt
    std::vector<Domain> out;
    out.reserve(handles.size());
    std::map<std::string, SharedDomain> found;  // kept for the calls that follow a listing
    for (auto& handle : handles) {
      auto domain = describe(*conn, handle.get());
      if (!domain) {
        if (domain.error().code == error::Errc::not_found) continue;  // undefined since the listing
        return std::unexpected(domain.error());
      }
      if (found.size() < kMaxHandles)
        found.try_emplace(domain->uuid, SharedDomain{handle.release(), DomainFree{}});
      out.push_back(std::move(*domain));
    }
    keep_handles(*conn, found);
    return out;
  }

  std::expected<void, VmError> record_termination(const std::string& uuid,
                                                  const TerminationRecord& record) override {
    auto target = lookup(uuid);
    if (!target) return std::unexpected(target.error());
    const ConnRef& conn = target->conn;
    virDomainPtr domain = target->domain.get();
    const std::string element = termination_element(record);
    const std::string ns{termination_ns};
    const std::string prefix{termination_prefix};
    // Live where it runs, persistent where it is defined (§5); the test driver accepts LIVE|CONFIG
    // on an active persistent domain and refuses LIVE on an inactive one. A domain that stops
    // between the check and the write is retried once with fresh flags.
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto flags = definition_flags(conn, uuid, domain);
      if (!flags) return std::unexpected(flags.error());
      if (lv().virDomainSetMetadata(domain, VIR_DOMAIN_METADATA_ELEMENT, element.c_str(), prefix.c_str(),
                                    ns.c_str(), *flags) == 0)
        return {};
      virErrorPtr last = lv().virGetLastError();
      const bool retry = attempt == 0 && last != nullptr && last->code == VIR_ERR_OPERATION_INVALID &&
                         (*flags & VIR_DOMAIN_AFFECT_LIVE) != 0;
      if (!retry) return std::unexpected(fail_on(conn, uuid));
    }
    return std::unexpected(fail_on(conn, uuid));
  }

  std::expected<std::optional<TerminationRecord>, VmError> termination(const std::string& uuid,
                                                                       Definition which) override {
    auto target = lookup(uuid);
    if (!target) return std::unexpected(target.error());
    const std::string ns{termination_ns};
    const unsigned flags = which == Definition::live ? VIR_DOMAIN_AFFECT_LIVE : VIR_DOMAIN_AFFECT_CONFIG;
    CString text{
        lv().virDomainGetMetadata(target->domain.get(), VIR_DOMAIN_METADATA_ELEMENT, ns.c_str(), flags)};
    if (!text) {
      virErrorPtr last = lv().virGetLastError();
      if (last != nullptr && last->code == VIR_ERR_NO_DOMAIN_METADATA) {
        lv().virResetLastError();
        return std::optional<TerminationRecord>{};
      }
      return std::unexpected(fail_on(target->conn, uuid));
    }
    return parse_termination(text.get());
  }

  std::expected<void, VmError> shutdown(const std::string& uuid) override {
    return act(uuid, [](virDomainPtr d) { return lv().virDomainShutdown(d); });
  }
  std::expected<void, VmError> destroy(const std::string& uuid) override {
    return act(uuid, [](virDomainPtr d) { return lv().virDomainDestroy(d); });
  }

  std::expected<std::string, VmError> state(const std::string& uuid) override {
    auto target = lookup(uuid);
    if (!target) return std::unexpected(target.error());
    int state = 0;
    int reason = 0;
    if (lv().virDomainGetState(target->domain.get(), &state, &reason, 0) < 0)
      return std::unexpected(fail_on(target->conn, uuid));
    return std::string{state_name(state)};
  }

  bool connected() const override { return connected_.load(); }
  bool watching() const override { return events_.load(); }

  // Swapping one function for another keeps the connection (its callbacks reach whatever function
  // the watcher id has now). Starting or stopping to watch drops it: the next call opens one that
  // is (or is not) subscribed, and the old one closes, deregistering its callbacks, once the calls
  // still using it are done. When this returns, the replaced function has finished and never runs
  // again, whatever libvirt still delivers.
  void watch(std::function<void()> on_change) override {
    const bool watching = static_cast<bool>(on_change);
    if (watching && detail::libvirt_api())
      start_event_loop();  // before the connection that is to hear events opens
    Watchers::get().set(watcher_id_, std::move(on_change));
    ConnRef old;  // released after the unlock
    std::lock_guard lock{mu_};
    if (watched_ == watching) return;
    watched_ = watching;
    old = std::exchange(conn_, nullptr);
    connected_ = false;
    events_ = false;
  }

 private:
  struct Target {
    ConnRef conn;  // keeps the connection open while `domain` is used
    SharedDomain domain;
  };

  // A fresh connection with, when watched, lifecycle events, a close callback and keepalive.
  // Round trips: called without mu_.
  std::expected<ConnRef, VmError> open(bool watched) {
    if (const auto& api = detail::libvirt_api(); !api) return std::unexpected(unreachable(api.error()));
    virConnectPtr raw = lv().virConnectOpen(uri_.c_str());
    if (raw == nullptr) return std::unexpected(unreachable(last_error(uri_ + ": ", "cannot connect")));
    auto conn = std::make_shared<Connection>(raw);
    if (watched) {
      void* opaque = reinterpret_cast<void*>(watcher_id_);
      conn->lifecycle_id =
          lv().virConnectDomainEventRegisterAny(raw, nullptr, VIR_DOMAIN_EVENT_ID_LIFECYCLE,
                                                VIR_DOMAIN_EVENT_CALLBACK(on_lifecycle), opaque, nullptr);
      conn->close_registered = lv().virConnectRegisterCloseCallback(raw, on_close, opaque, nullptr) == 0;
      (void)lv().virConnectSetKeepAlive(raw, 5, 3);  // not every driver has keepalive (test:/// has not)
      lv().virResetLastError();
    }
    return conn;
  }

  // The current connection, opening one if there is none or it died. Two calls that find none at
  // once both open one; the first to come back installs its own, the other closes its spare.
  std::expected<ConnRef, VmError> connection() {
    ConnRef current;
    bool watched = false;
    {
      std::lock_guard lock{mu_};
      current = conn_;
      watched = watched_;
    }
    if (current != nullptr) {
      if (lv().virConnectIsAlive(current->ptr) == 1) return current;
      forget(current);
    }
    auto fresh = open(watched);
    if (!fresh) return std::unexpected(fresh.error());
    ConnRef spare;  // closed after the unlock
    std::lock_guard lock{mu_};
    if (watched_ != watched) return *fresh;  // watch() changed its mind meanwhile: for this call only
    if (conn_ != nullptr) {
      spare = std::move(*fresh);
      return conn_;
    }
    conn_ = *fresh;
    connected_ = true;
    events_ = conn_->lifecycle_id >= 0 && conn_->close_registered;
    return conn_;
  }

  // `conn` stops being the current connection (if it still is); it closes when its last user is done.
  void forget(const ConnRef& conn) {
    ConnRef dropped;  // released after the unlock
    std::lock_guard lock{mu_};
    if (conn_ != conn) return;
    dropped = std::exchange(conn_, nullptr);
    connected_ = false;
    events_ = false;
  }

  // The error of the libvirt call on `conn` that just failed, mapped (before any other libvirt
  // call resets it). An error that says the connection is gone (`unavailable`), or any error on a
  // connection that is no longer alive, is `unavailable`, and the connection is forgotten so that
  // the next call opens a fresh one.
  VmError fail(const ConnRef& conn) {
    VmError e = last_error("", "unknown libvirt error");
    if (e.code == error::Errc::unavailable || lv().virConnectIsAlive(conn->ptr) != 1) {
      forget(conn);
      return unreachable(std::move(e));
    }
    return e;
  }

  // A domain's handle on the current connection, from the connection's cache or looked up (the
  // lookup without mu_; a handle another call cached meanwhile wins). A handle whose domain went
  // away makes the next call fail with VIR_ERR_NO_DOMAIN, which is `not_found` as a fresh lookup
  // would be; it is then forgotten.
  std::expected<Target, VmError> lookup(const std::string& uuid) {
    auto conn = connection();
    if (!conn) return std::unexpected(conn.error());
    {
      std::lock_guard lock{mu_};
      if (auto it = (*conn)->handles.find(uuid); it != (*conn)->handles.end())
        return Target{*conn, it->second};
    }
    virDomainPtr raw = lv().virDomainLookupByUUIDString((*conn)->ptr, uuid.c_str());
    if (raw == nullptr) {
      VmError error = fail(*conn);
      error.detail += " (uuid " + uuid + ")";
      return std::unexpected(std::move(error));
    }
    SharedDomain found{raw, DomainFree{}};
    std::map<std::string, SharedDomain> evicted;  // freed after the unlock, like `found` if unused
    std::lock_guard lock{mu_};
    auto& handles = (*conn)->handles;
    if (handles.size() >= kMaxHandles) evicted.swap(handles);
    return Target{*conn, handles.try_emplace(uuid, found).first->second};
  }

  // A listing's handles replace those kept, so that the calls that act on what it listed (a
  // termination's record, state and destroy) need no lookup, and domains gone since the last
  // listing are dropped. The handles replaced are released after the unlock, with `found`.
  void keep_handles(const ConnRef& conn, std::map<std::string, SharedDomain>& found) {
    std::lock_guard lock{mu_};
    conn->handles.swap(found);
  }

  // After a failed call on a cached handle: a domain that is gone is forgotten.
  VmError fail_on(const ConnRef& conn, const std::string& uuid) {
    VmError e = fail(conn);
    if (e.code != error::Errc::not_found) return e;
    SharedDomain dropped;  // freed after the unlock
    std::lock_guard lock{mu_};
    if (auto it = conn->handles.find(uuid); it != conn->handles.end()) {
      dropped = std::move(it->second);
      conn->handles.erase(it);
    }
    return e;
  }

  std::expected<unsigned, VmError> definition_flags(const ConnRef& conn, const std::string& uuid,
                                                    virDomainPtr domain) {
    const int active = lv().virDomainIsActive(domain);
    if (active < 0) return std::unexpected(fail_on(conn, uuid));
    const int persistent = lv().virDomainIsPersistent(domain);
    if (persistent < 0) return std::unexpected(fail_on(conn, uuid));
    unsigned flags = 0;
    if (active == 1) flags |= VIR_DOMAIN_AFFECT_LIVE;
    if (persistent == 1) flags |= VIR_DOMAIN_AFFECT_CONFIG;
    return flags == 0 ? static_cast<unsigned>(VIR_DOMAIN_AFFECT_CURRENT) : flags;
  }

  template <typename Call>
  std::expected<void, VmError> act(const std::string& uuid, Call call) {
    auto target = lookup(uuid);
    if (!target) return std::unexpected(target.error());
    if (call(target->domain.get()) < 0) return std::unexpected(fail_on(target->conn, uuid));
    return {};
  }

  std::expected<Domain, VmError> describe(const ConnRef& conn, virDomainPtr handle) {
    Domain domain;
    char uuid[VIR_UUID_STRING_BUFLEN];
    if (lv().virDomainGetUUIDString(handle, uuid) < 0) return std::unexpected(fail(conn));
    domain.uuid = uuid;
    const char* name = lv().virDomainGetName(handle);
    if (name == nullptr) return std::unexpected(fail(conn));
    domain.name = name;
    int state = 0;
    int reason = 0;
    if (lv().virDomainGetState(handle, &state, &reason, 0) < 0) return std::unexpected(fail(conn));
    domain.state = state_name(state);
    // The current definition: live when active, else persistent. It holds the metadata with its
    // namespaces, the hostdevs normalised by libvirt, in one snapshot.
    CString xml{lv().virDomainGetXMLDesc(handle, 0)};
    if (!xml) return std::unexpected(fail(conn));
    auto facts = parse_domain_xml(xml.get());  // one parse for all three
    domain.pci_addresses = std::move(facts.pci_addresses);
    domain.label = std::move(facts.label);
    domain.termination = std::move(facts.termination);
    return domain;
  }

  const std::string uri_;
  // This adapter's entry in Watchers: what its connections' callbacks carry; fixed for its life.
  const std::uintptr_t watcher_id_ = Watchers::get().make_id();
  // Shared state, guarded by mu_, which is held only to read or swap it, never across a libvirt
  // call (and never while a handle or connection is released: that is a libvirt call too):
  //   conn_     the current connection. Every call (any worker thread) copies it; a call that finds
  //             none or a dead one opens and installs a fresh one; a call whose error says it died,
  //             and watch() when it starts or stops watching, clear it.
  //   watched_  whether new connections subscribe to events: written by watch(), read by the call
  //             that opens a connection.
  //   Connection::handles, of every connection: replaced by each listing, read and filled by the
  //             calls that look a domain up, pruned by those that find it gone.
  // libvirt's event-loop thread touches none of it: its callbacks reach Watchers only, by id.
  std::mutex mu_;
  ConnRef conn_;
  bool watched_ = false;
  std::atomic<bool> connected_{false};  // read by connected() without mu_
  std::atomic<bool> events_{
      false};  // the current connection delivers lifecycle and close events; read by watching()
  static constexpr std::size_t kMaxHandles = 4096;
};

}  // namespace

std::unique_ptr<Hypervisor> make_libvirt(std::string uri) {
  return std::make_unique<Libvirt>(std::move(uri));
}

}  // namespace gpunode::vmctl
