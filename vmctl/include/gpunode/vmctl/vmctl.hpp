// gpunode/vmctl/vmctl.hpp: workloads as libvirt domains (CONTRACT §5, §7), the hypervisor
// adapter interface, pure parsers of domain XML and metadata, and the spot termination rule.
#pragma once

#include <chrono>
#include <expected>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/error/error.hpp"
#include "gpunode/reservations/entitlement.hpp"

namespace gpunode::vmctl {

inline constexpr std::string_view workload_ns = "urn:gpunode:workload:1";
inline constexpr std::string_view termination_ns = "urn:gpunode:termination:1";
inline constexpr std::string_view termination_prefix = "gpunodet";

// A workload's tier is the market's (the entitlement table's) tier.
using Tier = reservations::Tier;
using reservations::parse_tier;
using reservations::to_string;

// Valid §5 workload metadata (§7: non-empty vm-id and org, one of the three tiers).
struct WorkloadLabel {
  std::string vm_id;
  std::string org;
  Tier tier = Tier::spot;
  bool operator==(const WorkloadLabel&) const = default;
};

// <termination xmlns="urn:gpunode:termination:1" reason at by audit-id/>
struct TerminationRecord {
  std::string reason;
  std::string at;
  std::string by;
  std::string audit_id;
  bool operator==(const TerminationRecord&) const = default;
};

// libvirt's domain state, lowercased (§7 Vocabularies). Unknown numbers give "nostate".
std::string_view state_name(int libvirt_state);
// running, blocked, paused, shutdown (shutting down) and pmsuspended hold their devices (§7
// Occupancy); shutoff, crashed and nostate do not.
bool state_active(std::string_view state);

struct Domain {
  std::string uuid;
  std::string name;
  std::string state;                       // §7 vocabulary
  std::vector<std::string> pci_addresses;  // hostdev type='pci' sources, sorted, "0000:41:00.0"
  std::optional<WorkloadLabel> label;      // nullopt: unlabelled (no or invalid metadata)
  std::optional<TerminationRecord> termination;
  bool active() const { return state_active(state); }
};

// A hypervisor's error is the agent's one error (gpunode::error), its code decided once by
// from_libvirt where libvirt's error is read: `unavailable` when the hypervisor cannot be reached
// (the connection is gone or cannot be opened: whatever libvirt's code, the adapter says so),
// `not_found` when the domain is not there, another code otherwise. `detail` is libvirt's message
// (with the adapter's words around it, as they always read); `native` libvirt's virErrorNumber.
using VmError = error::Error;

// The code of libvirt's virErrorNumber (virGetLastError()'s `code`), the one mapping: what says
// the connection is gone or unusable (NO_CONNECT, INVALID_CONN, SYSTEM_ERROR, RPC,
// OPERATION_TIMEOUT, AUTH_FAILED/CANCELLED/UNAVAILABLE) unavailable; no such domain, snapshot,
// checkpoint, metadata, network, pool, volume, node device or secret not_found;
// OPERATION_INVALID (a domain that is not running), INVALID_ARG, XML_ERROR/XML_DETAIL invalid;
// OPERATION_DENIED/ACCESS_DENIED permission; DOM_EXIST exists; RESOURCE_BUSY busy;
// AGENT_UNRESPONSIVE timeout; NO_SUPPORT, OPERATION/ARGUMENT_UNSUPPORTED protocol (the driver
// does not do what the agent asks); OK (none), INTERNAL_ERROR, NO_MEMORY, INVALID_DOMAIN
// internal; anything else (OPERATION_FAILED, a hook script that failed, ...) io.
error::Errc libvirt_code(int code);
// An Error of libvirt's `code` (native `code`, origin libvirt; none for code 0) with `detail` whole.
error::Error from_libvirt(int code, std::string detail);

// Which definition of a domain to read.
enum class Definition { live, persistent };

// The hypervisor adapter. Every call blocks: the daemon runs them on a worker thread, never on an
// I/O thread. An instance may be used from several threads at once; its calls may run concurrently.
class Hypervisor {
 public:
  virtual ~Hypervisor() = default;
  // Every defined domain, active and inactive.
  virtual std::expected<std::vector<Domain>, VmError> list() = 0;
  // Adds (or replaces) the termination element in the live definition when the domain is active
  // and in the persistent one when it is persistent (§5). Never touches the workload element.
  virtual std::expected<void, VmError> record_termination(const std::string& uuid,
                                                          const TerminationRecord& record) = 0;
  // The termination element of one definition; nullopt when it has none. Asking for the live
  // definition of an inactive domain (or the persistent one of a transient domain) is `invalid`.
  virtual std::expected<std::optional<TerminationRecord>, VmError> termination(const std::string& uuid,
                                                                               Definition which) = 0;
  virtual std::expected<void, VmError> shutdown(const std::string& uuid) = 0;  // graceful (ACPI)
  virtual std::expected<void, VmError> destroy(const std::string& uuid) = 0;   // hard stop
  virtual std::expected<std::string, VmError> state(const std::string& uuid) = 0;
  virtual bool connected() const = 0;
  // Asks to be told when a domain starts, stops, is defined or undefined, and when the connection
  // closes: `on_change` runs on a thread of the adapter, must be quick, and must not call back
  // into the adapter. Call it before the first call; an empty function stops watching. When
  // watch() returns (and when the adapter is destroyed) the function it replaced has finished and
  // never runs again, so what it refers to may go away right after. The default watches nothing (a
  // caller still refreshes on its own schedule).
  virtual void watch(std::function<void()> on_change) { (void)on_change; }
  // Whether events reach watch()'s function now: a live connection subscribed to lifecycle events
  // and to its own close. While they do, a caller need not list the domains on a schedule.
  virtual bool watching() const { return false; }
};

// libvirt through its C API. `uri` as in config ("qemu:///system", "test:///abs/node.xml").
// Connects lazily on the first call. Calls share one connection and run on it concurrently (a
// listing does not hold back a termination). A call that fails because the connection died (or
// finds it dead) drops it and answers `unavailable`; the next call opens a fresh one, so a
// libvirtd restart is survived; a dropped connection closes once the calls still on it are done.
// libvirt's default error printer is replaced; its messages come back in the VmError's detail,
// its code in `native`.
// watch() starts libvirt's event loop on a thread of its own (once per process) and, on every
// connection it opens, registers for domain lifecycle events, a close callback and keepalive
// probes (5 s, 3 misses), so a libvirtd that hangs fails calls within ~20 s instead of forever.
std::unique_ptr<Hypervisor> make_libvirt(std::string uri);

// --- pure parsers (libxml2; never throw; garbage gives empty / nullopt) ---

// Sorted, unique "dddd:bb:ss.f" of <devices><hostdev type='pci'><source><address .../>. Values
// are read as libvirt reads them (C base 0: "0x41" hex, "65" decimal, "010" octal); `domain`
// defaults to 0; a hostdev missing bus, slot or function, or with one out of range, is skipped.
std::vector<std::string> hostdev_pci_addresses(std::string_view domain_xml);

// The workload label from (a) the element alone, as virDomainGetMetadata returns it (libvirt strips
// the namespace there, so a root <workload> in no namespace or in urn:gpunode:workload:1 counts), or
// (b) a <metadata> or <domain> document holding <P:workload xmlns:P="urn:gpunode:workload:1">
// with any prefix. nullopt when missing or invalid (§7).
std::optional<WorkloadLabel> parse_workload(std::string_view xml);
// The termination record, read the same way (namespace urn:gpunode:termination:1). nullopt when
// missing or when the text is not XML; missing attributes are empty strings.
std::optional<TerminationRecord> parse_termination(std::string_view xml);
// The three above from one parse of a domain's XML (what list() needs for each domain), and what
// the libvirt hook's admission needs besides (CONTRACT §9).
struct DomainXmlFacts {
  std::vector<std::string> pci_addresses;
  std::optional<WorkloadLabel> label;
  std::optional<TerminationRecord> termination;
  bool is_domain = false;                   // the text is XML whose root is <domain>
  std::string name, uuid;                   // <name>, <uuid> (empty when missing)
  std::size_t unreadable_pci_hostdevs = 0;  // <hostdev type='pci'> whose source address cannot be read
};
DomainXmlFacts parse_domain_xml(std::string_view domain_xml);
namespace detail {
// The same from a document tree, by the three parsers' own readers: parse_domain_xml reads SAX
// events instead (list() parses every domain's XML) and falls back to this for what it leaves to
// the tree (a DTD, an attribute value read that holds '&'); the tests and the fuzzer hold the two
// to the same answers.
DomainXmlFacts parse_domain_xml_tree(std::string_view domain_xml);
}  // namespace detail
// The §5 element: <termination xmlns="urn:gpunode:termination:1" reason=".." at=".." by=".." audit-id=".."/>
std::string termination_xml(const TerminationRecord& record);
// The same element without the xmlns attribute: what virDomainSetMetadata takes (it adds the namespace).
std::string termination_element(const TerminationRecord& record);

// --- the termination rule (§4 terminate-spot, §5) ---

struct TerminateResult {
  bool terminated = false;  // true only when the hypervisor says the domain is no longer active
  std::string detail;
};

// Terminates one spot domain: writes `record` first; then, for grace > 0, a graceful shutdown
// and a poll of the state until the grace is spent, then destroy; destroy at once for grace 0.
// A domain whose label is not tier spot is refused (VmError invalid "not spot") with no call at all.
// Errors: recording the termination failed (nothing was stopped), or the hypervisor became
// unavailable (`unavailable`). A refused or ineffective stop is {terminated=false, detail}.
// `sleep` is called between polls (tests pass a fake); the grace is measured by what was slept.
std::expected<TerminateResult, VmError> terminate_spot(
    Hypervisor& hypervisor, const Domain& domain, const TerminationRecord& record, std::chrono::seconds grace,
    const std::function<void(std::chrono::milliseconds)>& sleep);

inline constexpr std::chrono::milliseconds terminate_poll_interval{200};

// Many domains at once (terminate-spot, reclaim): every record is written first, every graceful
// shutdown asked for, the states polled until each job's grace is spent, then the survivors
// destroyed. One outcome per job, in order. `sleep` returns false when the agent is stopping:
// the jobs not decided yet end with `unavailable` ("the agent stopped ..."), so they are finished
// later rather than reported either way.
struct TerminationJob {
  Domain domain;
  TerminationRecord record;
  std::chrono::seconds grace{0};
};
struct TerminationOutcome {
  std::string uuid;
  std::expected<TerminateResult, VmError> result;
};
using Sleeper = std::function<bool(std::chrono::milliseconds)>;
std::vector<TerminationOutcome> terminate_spot_all(Hypervisor& hypervisor,
                                                   const std::vector<TerminationJob>& jobs,
                                                   const Sleeper& sleep);

}  // namespace gpunode::vmctl
