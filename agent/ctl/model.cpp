#include "gpunode/ctl/model.hpp"

#include <fmt/format.h>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <charconv>

#include "gpunode/reservations/model.hpp"
#include "gpunode/text/printable.hpp"

namespace gpunode::ctl {
namespace json = boost::json;

namespace {

// Reads one object's fields; the first wrong one is kept as the error, with its place. Its strings
// are for people (the tables and pictures; --json prints the body itself): each is escaped
// (text::printable), so an org's note or reason cannot drive the operator's terminal.
class Fields {
 public:
  Fields(const json::value& v, std::string place, std::string& error)
      : place_(std::move(place)), error_(error) {
    obj_ = v.if_object();
    if (obj_ == nullptr) fail(place_, "not an object");
  }

  std::string str(std::string_view key) { return opt_str(key).value_or(""); }

  std::optional<std::string> opt_str(std::string_view key) {
    const auto* v = get(key);
    if (v == nullptr || v->is_null()) return std::nullopt;
    if (const auto* s = v->if_string()) return text::printable(*s);
    fail(at(key), "not a string");
    return std::nullopt;
  }

  std::int64_t integer(std::string_view key) { return opt_int(key).value_or(0); }

  std::optional<std::int64_t> opt_int(std::string_view key) {
    const auto* v = get(key);
    if (v == nullptr || v->is_null()) return std::nullopt;
    if (const auto* i = v->if_int64()) return *i;
    if (const auto* u = v->if_uint64(); u != nullptr && *u <= static_cast<std::uint64_t>(INT64_MAX))
      return static_cast<std::int64_t>(*u);
    fail(at(key), "not an integer");
    return std::nullopt;
  }

  bool boolean(std::string_view key) {
    const auto* v = get(key);
    if (v == nullptr) return false;
    if (const auto* b = v->if_bool()) return *b;
    fail(at(key), "not true or false");
    return false;
  }

  std::vector<std::string> strings(std::string_view key) {
    std::vector<std::string> out;
    each(key, [&](const json::value& x, const std::string& place) {
      if (const auto* s = x.if_string())
        out.push_back(text::printable(*s));
      else
        fail(place, "not a string");
    });
    return out;
  }

  std::vector<std::int64_t> ints(std::string_view key) {
    std::vector<std::int64_t> out;
    each(key, [&](const json::value& x, const std::string& place) {
      if (const auto* i = x.if_int64())
        out.push_back(*i);
      else
        fail(place, "not an integer");
    });
    return out;
  }

  // Calls f(value, "place.key") for the object at `key` (absent or null: not called).
  template <class F>
  void object(std::string_view key, F&& f) {
    const auto* v = get(key);
    if (v == nullptr || v->is_null()) return;
    if (!v->is_object()) return fail(at(key), "not an object");
    f(*v, at(key));
  }

  // Calls f(element, "place[i]") for each element of the array at `key` (absent: none).
  template <class F>
  void each(std::string_view key, F&& f) {
    const auto* v = get(key);
    if (v == nullptr || v->is_null()) return;
    const auto* a = v->if_array();
    if (a == nullptr) return fail(at(key), "not an array");
    for (std::size_t i = 0; i < a->size() && error_.empty(); ++i)
      f((*a)[i], fmt::format("{}[{}]", at(key), i));
  }

  [[nodiscard]] bool ok() const { return error_.empty(); }

 private:
  const json::value* get(std::string_view key) const {
    return obj_ == nullptr ? nullptr : obj_->if_contains(key);
  }
  std::string at(std::string_view key) const {
    return place_.empty() ? std::string(key) : fmt::format("{}.{}", place_, key);
  }
  void fail(const std::string& place, std::string_view what) {
    if (error_.empty()) error_ = fmt::format("{}: {}", place.empty() ? "the body" : place, what);
  }

  const json::object* obj_ = nullptr;
  std::string place_;
  std::string& error_;
};

std::string bad(std::string_view what, const std::string& error) {
  return fmt::format("the agent's {} is not what the contract says: {}", what, error);
}

Health read_health(const json::value& v, const std::string& place, std::string& error) {
  Fields f(v, place, error);
  Health h;
  h.state = f.str("state");
  f.each("reasons", [&](const json::value& x, const std::string& p) {
    Fields r(x, p, error);
    h.reasons.push_back(HealthReason{r.str("code"), r.str("pciAddress"), r.str("detail"), r.str("since")});
  });
  return h;
}

UnitHealthView read_unit_health(const json::value& v, const std::string& place, std::string& error) {
  UnitHealthView u;
  u.health = read_health(v, place, error);
  Fields f(v, place, error);
  u.unit_id = f.str("unitId");
  f.each("devices", [&](const json::value& x, const std::string& p) {
    Fields d(x, p, error);
    HealthDevice hd{d.str("pciAddress"),          d.str("role"),
                    d.opt_str("powerState"),      d.opt_str("linkSpeed"),
                    d.opt_int("linkWidth"),       d.opt_int("maxLinkWidth"),
                    d.opt_int("widestLinkWidth"), std::nullopt};
    d.object("aer", [&](const json::value& a, const std::string& ap) {
      Fields c(a, ap, error);
      hd.aer = std::vector<std::optional<std::int64_t>>{c.opt_int("fatal"), c.opt_int("nonfatal"),
                                                        c.opt_int("correctable")};
    });
    u.devices.push_back(std::move(hd));
  });
  return u;
}

Unit read_unit(const json::value& v, const std::string& place, std::string& error) {
  Fields f(v, place, error);
  Unit u;
  u.id = f.str("id");
  u.iommu_group = f.opt_int("iommuGroup");
  u.cls = f.str("class");
  u.gpu_count = f.integer("gpuCount");
  u.numa_nodes = f.ints("numaNodes");
  u.sellable = f.boolean("sellable");
  u.reservable = f.boolean("reservable");
  f.each("notReservableReasons", [&](const json::value& x, const std::string& p) {
    Fields r(x, p, error);
    u.reasons.push_back(Reason{r.str("code"), r.str("message")});
  });
  f.each("gpus", [&](const json::value& x, const std::string& p) {
    Fields g(x, p, error);
    u.gpus.push_back(Gpu{g.str("pciAddress"), g.opt_str("name")});
  });
  f.each("devices", [&](const json::value& x, const std::string& p) {
    Fields d(x, p, error);
    u.devices.push_back(Device{d.str("pciAddress"), d.str("role"), d.str("vendorId"), d.str("deviceId"),
                               d.str("classCode"), d.opt_str("driver")});
  });
  u.reservation_ids = f.strings("reservationIds");
  f.object("health",
           [&](const json::value& x, const std::string& p) { u.health = read_health(x, p, error); });
  return u;
}

Reservation read_reservation(const json::value& v, const std::string& place, std::string& error) {
  Fields f(v, place, error);
  Reservation r;
  r.id = f.str("id");
  r.state = f.str("state");
  r.unit_ids = f.strings("unitIds");
  r.audience = f.strings("audienceOrgIds");
  r.managers = f.strings("managingOrgIds");
  r.released = f.strings("releasedUnitIds");
  r.reclaiming = f.strings("reclaimingUnitIds");
  r.starts_at = f.str("startsAt");
  r.ends_at = f.str("endsAt");
  r.starts = reservations::parse_time(r.starts_at);
  r.ends = reservations::parse_time(r.ends_at);
  r.ended_at = f.opt_str("endedAt");
  r.end_reason = f.opt_str("endReason");
  r.note = f.str("note");
  r.version = f.integer("version");
  return r;
}

Workload read_workload(const json::value& v, const std::string& place, std::string& error) {
  Fields f(v, place, error);
  Workload w;
  w.vm_id = f.opt_str("vmId");
  w.org = f.opt_str("org");
  w.tier = f.opt_str("tier");
  w.termination_reason = f.opt_str("terminationReason");
  w.name = f.str("name");
  w.domain_uuid = f.str("domainUuid");
  w.state = f.str("state");
  w.unit_ids = f.strings("unitIds");
  return w;
}

template <class T, class Read>
std::vector<T> read_list(Fields& f, std::string_view key, std::string& error, Read read) {
  std::vector<T> out;
  f.each(key, [&](const json::value& x, const std::string& p) { out.push_back(read(x, p, error)); });
  return out;
}

}  // namespace

error::Result<std::map<std::string, std::string>> decode_unentitled(const json::value& body) {
  std::string error;
  Fields f(body, "", error);
  std::map<std::string, std::string> out;
  f.each("workloads", [&](const json::value& x, const std::string& p) {
    Fields w(x, p, error);
    std::vector<std::string> why;
    w.each("reasons", [&](const json::value& rv, const std::string& rp) {
      Fields r(rv, rp, error);
      why.push_back(fmt::format("{}: {}", r.opt_str("unitId").value_or("-"), r.str("code")));
    });
    out[w.str("domainUuid")] = fmt::format("{}", fmt::join(why, ", "));
  });
  if (!error.empty()) return error::fail(error::Errc::protocol, bad("unentitled workloads", error));
  return out;
}

error::Result<std::vector<UnitHealthView>> decode_health(const json::value& body) {
  std::string error;
  std::vector<UnitHealthView> out;
  const auto* o = body.if_object();
  if (o != nullptr && o->contains("units")) {
    Fields f(body, "", error);
    out = read_list<UnitHealthView>(f, "units", error, read_unit_health);
  } else {
    out.push_back(read_unit_health(body, "", error));
  }
  if (!error.empty()) return error::fail(error::Errc::protocol, bad("health", error));
  return out;
}

error::Result<NodeState> decode_state(const json::value& body) {
  std::string error;
  Fields f(body, "", error);
  NodeState s;
  s.node_id = f.str("nodeId");
  s.revision = f.integer("revision");
  s.units = read_list<Unit>(f, "units", error, read_unit);
  s.reservations = read_list<Reservation>(f, "reservations", error, read_reservation);
  s.workloads = read_list<Workload>(f, "workloads", error, read_workload);
  if (!error.empty()) return error::fail(error::Errc::protocol, bad("state", error));
  return s;
}

error::Result<std::vector<Reservation>> decode_reservations(const json::value& body, std::string_view key) {
  std::string error;
  Fields f(body, "", error);
  auto list = read_list<Reservation>(f, key, error, read_reservation);
  if (!error.empty()) return error::fail(error::Errc::protocol, bad("reservation list", error));
  return list;
}

error::Result<Reservation> decode_reservation(const json::value& body) {
  std::string error;
  auto r = read_reservation(body, "", error);
  if (!error.empty()) return error::fail(error::Errc::protocol, bad("reservation", error));
  return r;
}

error::Result<std::vector<Workload>> decode_workloads(const json::value& body) {
  std::string error;
  Fields f(body, "", error);
  auto list = read_list<Workload>(f, "workloads", error, read_workload);
  if (!error.empty()) return error::fail(error::Errc::protocol, bad("workload list", error));
  return list;
}

std::optional<double> metric_value(std::string_view text, std::string_view name) {
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    if (!line.starts_with(name) || line.size() == name.size()) continue;
    std::string_view rest = line.substr(name.size());
    if (rest.front() == '{') {
      const auto close = rest.find('}');
      if (close == std::string_view::npos) continue;
      rest = rest.substr(close + 1);
    }
    if (rest.empty() || rest.front() != ' ') continue;
    rest.remove_prefix(1);
    rest = rest.substr(0, rest.find(' '));  // a timestamp may follow
    double v = 0;
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
    if (ec == std::errc{} && p == rest.data() + rest.size()) return v;
  }
  return std::nullopt;
}

}  // namespace gpunode::ctl
