// gpunodectl's commands: arguments (CLI11) to requests, answers to text (CONTRACT §8).
#include "gpunode/ctl/app.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <map>
#include <optional>
#include <vector>

#include "arguments.hpp"
#include "audit_proof.hpp"
#include "gpunode/ctl/model.hpp"
#include "gpunode/ctl/outcome.hpp"
#include "gpunode/ctl/paging.hpp"
#include "gpunode/ctl/render.hpp"
#include "gpunode/ctl/socket_path.hpp"
#include "gpunode/json/strict.hpp"
#include "gpunode/text/printable.hpp"
#include "health.hpp"

namespace gpunode::ctl {
namespace json = boost::json;

namespace {

struct Answer {
  unsigned status = 0;
  std::string raw;
  json::value doc;
};

// One command's run: the transport, the node, how to print.
class Session {
 public:
  Session(Transport& t, const Env& env, bool json_out, Style style)
      : t_(t), env_(env), json_(json_out), style_(style) {}

  // `json_body`: the answer is JSON (every route but /metrics).
  std::expected<Answer, Failure> call(const Request& r, bool json_body = true) {
    auto res = t_.call(r);
    if (!res) return std::unexpected(Failure{kExitUnreachable, describe(res.error(), env_.uid), {}});
    if (res->status < 200 || res->status > 299)
      return std::unexpected(Failure{kExitProblem, render_problem(res->status, res->body), res->body});
    Answer a{res->status, std::move(res->body), nullptr};
    if (a.raw.empty() || !json_body) return a;
    auto doc = gpunode::json::parse_strict(a.raw);
    if (!doc) {
      return std::unexpected(Failure{kExitProblem,
                                     fmt::format("gpunodectl: bad-answer: {} {}: the body is not JSON: {}\n",
                                                 r.method, r.target, doc.error().to_string()),
                                     {}});
    }
    a.doc = std::move(*doc);
    return a;
  }

  // The node id comes from the agent (CONTRACT §8: the operator never types it).
  std::expected<std::string, Failure> node() {
    if (node_) return *node_;
    auto h = call(healthz_request());
    if (!h) return std::unexpected(h.error());
    const auto* o = h->doc.if_object();
    const auto* id = o == nullptr ? nullptr : o->if_contains("nodeId");
    if (id == nullptr || !id->is_string()) {
      return std::unexpected(Failure{kExitProblem,
                                     "gpunodectl: bad-answer: GET /healthz on the admin socket has no nodeId "
                                     "(is this a gpunode-agent?)\n",
                                     {}});
    }
    node_ = std::string(id->get_string());  // used in request paths; shown escaped (status)
    if (const auto* v = o->if_contains("version"); v != nullptr && v->is_string())
      version_ = text::printable(v->get_string());
    if (const auto* rev = o->if_contains("revision"); rev != nullptr && rev->is_int64())
      revision_ = rev->get_int64();
    return *node_;
  }

  std::expected<NodeState, Failure> state() {
    auto n = node();
    if (!n) return std::unexpected(n.error());
    auto a = call(state_request(*n));
    if (!a) return std::unexpected(a.error());
    state_raw_ = a->doc;
    auto st = decoded(decode_state(a->doc));
    // The domains on units they are not entitled to (CONTRACT §9), for the pictures; an agent
    // without the route leaves them unknown.
    if (st) {
      if (auto u = call(unentitled_request()); u) {
        if (auto m = decode_unentitled(u->doc)) st->unentitled = std::move(*m);
      }
    }
    return st;
  }

  template <class T>
  std::expected<T, Failure> decoded(error::Result<T> v) {
    if (!v)
      return std::unexpected(
          Failure{kExitProblem, fmt::format("gpunodectl: bad-answer: {}\n", v.error().detail), {}});
    return std::move(*v);
  }

  // --json: the body as it came; else the text for people.
  Result print(const Answer& a, const std::function<std::expected<std::string, Failure>()>& people) {
    if (json_) return Result{kExitOk, a.raw + "\n", {}};
    auto text = people();
    if (!text) return fail(text.error());
    return Result{kExitOk, *text, {}};
  }

  // A way to call the agent for the commands of other files (audit export and verify, health).
  std::function<std::expected<Page, Failure>(const Request&)> caller() {
    return [this](const Request& r) -> std::expected<Page, Failure> {
      auto a = call(r);
      if (!a) return std::unexpected(a.error());
      return Page{std::move(a->doc), std::move(a->raw)};
    };
  }

  Result fail(const Failure& f) const {
    return Result{f.exit_code, json_ && !f.body.empty() ? f.body + "\n" : "", f.message};
  }

  bool json_out() const { return json_; }
  const Style& style() const { return style_; }
  const Env& env() const { return env_; }
  const std::string& version() const { return version_; }
  std::int64_t revision() const { return revision_; }
  const json::value& state_raw() const { return state_raw_; }

 private:
  Transport& t_;
  const Env& env_;
  bool json_;
  Style style_;
  std::optional<std::string> node_;
  std::string version_;
  std::int64_t revision_ = 0;
  json::value state_raw_;
};

// What the command line holds once parsed.
struct Options {
  std::optional<std::string> socket;
  bool json = false;
  std::string id, org, state, units, audience, managers, starts, ends, note, if_match, reason, reservation,
      after;
  int grace = -1, weeks = 4;
  std::size_t limit = 0;
  bool terminate_spot = false;
  bool dry_run = false;  // reclaim, terminate-spot: --dry-run
  ProofArgs proof;       // audit export, audit verify
  HealthArgs health;     // health, health clear
};

std::expected<std::string, Failure> reservation_text(Session& s, const json::value& body,
                                                     std::string_view headline) {
  auto r = s.decoded(decode_reservation(body));
  if (!r) return std::unexpected(r.error());
  return fmt::format("{} {}\n{}", headline, r->id, render_reservation(*r, s.style()));
}

// ---- what the commands share ----------------------------------------------------------------

Result print_list(
    Session& s, std::string_view key, std::optional<std::size_t> max_items,
    const std::function<Request(const std::string& node, const std::optional<std::string>& token,
                                std::size_t limit)>& page,
    const std::function<std::expected<std::string, Failure>(const json::value&)>& people) {
  auto n = s.node();
  if (!n) return s.fail(n.error());
  auto all = collect_pages(
      key, max_items,
      [&](const std::optional<std::string>& token, std::size_t limit) -> std::expected<Page, Failure> {
        auto a = s.call(page(*n, token, limit));
        if (!a) return std::unexpected(a.error());
        return Page{std::move(a->doc), std::move(a->raw)};
      });
  if (!all) return s.fail(all.error());
  if (s.json_out())
    return Result{kExitOk, (all->raw.empty() ? json::serialize(all->doc) : all->raw) + "\n", {}};
  auto text = people(all->doc);
  if (!text) return s.fail(text.error());
  return Result{kExitOk, *text, {}};
}

// A route answered with one body: --json prints it, else `people` renders it.
Result one(Session& s, const std::function<Request(const std::string& node)>& request,
           const std::function<std::expected<std::string, Failure>(const json::value&)>& people) {
  auto n = s.node();
  if (!n) return s.fail(n.error());
  auto a = s.call(request(*n));
  if (!a) return s.fail(a.error());
  return s.print(*a, [&] { return people(a->doc); });
}

const json::value& field(const json::value& v, std::string_view key) {
  static const json::value null;
  const auto* o = v.if_object();
  const auto* f = o == nullptr ? nullptr : o->if_contains(key);
  return f == nullptr ? null : *f;
}

std::string terminations_text(Session& s, const json::value& body) {
  return render_terminations(body, s.style());
}

std::optional<std::string> unless_empty(const std::string& v) {
  return v.empty() ? std::nullopt : std::optional<std::string>(v);
}

// The value of the option `name` when it was given, even as "".
std::optional<std::string> if_given(const CLI::App& cmd, const std::string& name, const std::string& value) {
  return cmd.count(name) > 0 ? std::optional<std::string>(value) : std::nullopt;
}

// ---- the commands, each an `arguments` (its options into Options) and a `cmd_` (its run) ----

void no_arguments(CLI::App&, Options&, Time) {}

Result cmd_units(Session& s, const Options&, const CLI::App&) {
  if (s.json_out()) {
    auto n = s.node();
    if (!n) return s.fail(n.error());
    auto a = s.call(units_request(*n));
    return a ? s.print(*a, {}) : s.fail(a.error());
  }
  auto st = s.state();
  if (!st) return s.fail(st.error());
  return Result{kExitOk, render_units_tree(*st, s.style()), {}};
}

void reservations_arguments(CLI::App& cmd, Options& o, Time) {
  cmd.add_option("--state", o.state, "Only reservations in this state")
      ->check(CLI::IsMember({"scheduled", "active", "ended"}));
}

Result cmd_reservations(Session& s, const Options& o, const CLI::App&) {
  const auto state = unless_empty(o.state);
  return print_list(
      s, "reservations", std::nullopt,
      [&](const std::string& node, const std::optional<std::string>& token, std::size_t limit) {
        return reservations_page(node, state, limit, token);
      },
      [&](const json::value& doc) -> std::expected<std::string, Failure> {
        auto list = s.decoded(decode_reservations(doc));
        if (!list) return std::unexpected(list.error());
        return render_reservations(*list, s.style());
      });
}

void reservation_arguments(CLI::App& cmd, Options& o, Time) {
  cmd.add_option("ID", o.id, "The reservation id (rsv_...)")->required();
}

Result cmd_reservation(Session& s, const Options& o, const CLI::App&) {
  return one(
      s, [&](const std::string& n) { return reservation_request(n, o.id); },
      [&](const json::value& b) { return reservation_text(s, b, "reservation"); });
}

void reserve_arguments(CLI::App& cmd, Options& o, Time now) {
  cmd.add_option("--units", o.units, "Units to reserve (u-0000-41-00-0,...)")
      ->required()
      ->check(ids_validator());
  cmd.add_option("--audience", o.audience, "Orgs that may use the units")->required()->check(ids_validator());
  cmd.add_option("--managers", o.managers,
                 "Orgs that manage the reservation (release, reclaim); default none")
      ->check(ids_validator(true));
  cmd.add_option("--starts", o.starts, "When the term starts (default: now)")->check(time_validator(now));
  cmd.add_option("--ends", o.ends, "When the term ends")->required()->check(time_validator(now));
  cmd.add_option("--note", o.note, "A note (at most 1024 characters)");
}

// The reservation made, and the spot VMs already on its units.
std::expected<std::string, Failure> created_text(Session& s, const json::value& body) {
  auto text = reservation_text(s, body, "created reservation");
  if (!text) return text;
  auto spot = decode_workloads(json::object{{"workloads", field(body, "spotWorkloads")}});
  if (spot && !spot->empty())
    *text += "spot VMs on its units (allowed; they may be terminated on reclaim):\n" +
             render_workloads(*spot, s.style());
  return text;
}

Result cmd_reserve(Session& s, const Options& o, const CLI::App& cmd) {
  const Time now = s.env().now;
  ReserveArgs a{
      ids_of(o.units),      ids_of(o.audience),
      ids_of(o.managers),   o.starts.empty() ? std::nullopt : std::optional<Time>(when_of(o.starts, now)),
      when_of(o.ends, now), if_given(cmd, "--note", o.note)};
  return one(
      s, [&](const std::string& n) { return reserve_request(n, a); },
      [&](const json::value& b) { return created_text(s, b); });
}

void amend_arguments(CLI::App& cmd, Options& o, Time now) {
  cmd.add_option("ID", o.id, "The reservation id")->required();
  cmd.add_option("--units", o.units, "The new units")->check(ids_validator());
  cmd.add_option("--audience", o.audience, "The new audience orgs")->check(ids_validator());
  cmd.add_option("--managers", o.managers, "The new managing orgs (\"\": none)")->check(ids_validator(true));
  cmd.add_option("--starts", o.starts, "The new start (only while scheduled)")->check(time_validator(now));
  cmd.add_option("--ends", o.ends, "The new end (after now)")->check(time_validator(now));
  cmd.add_option("--note", o.note, "The new note");
  cmd.add_option("--if-match", o.if_match,
                 "Only if the reservation is at this version (else 412 version-mismatch)");
}

// An amend that changes nothing is a usage error, told before the agent is asked.
std::optional<Result> amend_usage(const CLI::App& cmd, const Options& o) {
  if (!o.units.empty() || !o.audience.empty() || cmd.count("--managers") > 0 || !o.starts.empty() ||
      !o.ends.empty() || cmd.count("--note") > 0)
    return std::nullopt;
  return Result{kExitUsage,
                {},
                fmt::format("gpunodectl: amend: nothing to change: give at least one of --units, "
                            "--audience, --managers, --starts, --ends, --note\n\n{}",
                            cmd.help("gpunodectl"))};
}

Result cmd_amend(Session& s, const Options& o, const CLI::App& cmd) {
  const Time now = s.env().now;
  AmendArgs a;
  if (!o.units.empty()) a.units = ids_of(o.units);
  if (!o.audience.empty()) a.audience = ids_of(o.audience);
  if (cmd.count("--managers") > 0) a.managers = ids_of(o.managers);
  if (!o.starts.empty()) a.starts = when_of(o.starts, now);
  if (!o.ends.empty()) a.ends = when_of(o.ends, now);
  a.note = if_given(cmd, "--note", o.note);
  a.if_match = unless_empty(o.if_match);
  return one(
      s, [&](const std::string& n) { return amend_request(n, o.id, a); },
      [&](const json::value& b) { return reservation_text(s, b, "amended reservation"); });
}

void end_arguments(CLI::App& cmd, Options& o, Time) {
  cmd.add_option("ID", o.id, "The reservation id")->required();
  cmd.add_option("--reason", o.reason, "Why (kept in the audit log)");
  cmd.add_flag("--dry-run", o.dry_run, "Show the VMs it would stop and leave running; do nothing");
}

Result cmd_end(Session& s, const Options& o, const CLI::App& cmd) {
  const auto reason = if_given(cmd, "--reason", o.reason);
  return one(
      s, [&](const std::string& n) { return end_request(n, o.id, reason); },
      [&](const json::value& b) { return reservation_text(s, b, "ended reservation"); });
}

void release_arguments(CLI::App& cmd, Options& o, Time) {
  cmd.add_option("ID", o.id, "The reservation id")->required();
  cmd.add_option("--units", o.units, "The units to release")->required()->check(ids_validator());
}

Result cmd_release(Session& s, const Options& o, const CLI::App&) {
  return one(
      s, [&](const std::string& n) { return release_request(n, o.id, ids_of(o.units)); },
      [&](const json::value& b) {
        return reservation_text(s, field(b, "reservation"), fmt::format("released {} to spot from", o.units));
      });
}

void reclaim_arguments(CLI::App& cmd, Options& o, Time) {
  cmd.add_option("ID", o.id, "The reservation id")->required();
  cmd.add_option("--units", o.units, "The units to take back")->required()->check(ids_validator());
  cmd.add_flag("--terminate-spot", o.terminate_spot,
               "Terminate the spot VMs on them now (else they stay reclaiming until vacated)");
  cmd.add_flag("--dry-run", o.dry_run,
               "Show what it would do (the VMs it would stop, the reservation after); do nothing");
}

Result cmd_reclaim(Session& s, const Options& o, const CLI::App&) {
  return one(
      s,
      [&](const std::string& n) {
        return reclaim_request(n, o.id, ids_of(o.units), o.terminate_spot, o.dry_run);
      },
      [&](const json::value& b) -> std::expected<std::string, Failure> {
        auto text = reservation_text(s, field(b, "reservation"),
                                     o.dry_run ? fmt::format("would reclaim {} from spot for", o.units)
                                               : fmt::format("reclaimed {} from spot for", o.units));
        if (!text) return text;
        return *text + "\n" + terminations_text(s, b);
      });
}

void terminate_spot_arguments(CLI::App& cmd, Options& o, Time) {
  cmd.add_option("--units", o.units, "Only on these units")->check(ids_validator());
  cmd.add_option("--reservation", o.reservation, "Only on this reservation's units");
  cmd.add_option("--grace", o.grace,
                 "Seconds of graceful shutdown before destroy, 0..300 (default: libvirt.shutdown_grace)")
      ->check(CLI::Range(0, 300));
  cmd.add_option("--reason", o.reason, "Why (kept in the audit log)");
  cmd.add_flag("--dry-run", o.dry_run, "Show the VMs it would stop and leave running; do nothing");
}

Result cmd_terminate_spot(Session& s, const Options& o, const CLI::App& cmd) {
  TerminateArgs a;
  if (!o.units.empty()) a.units = ids_of(o.units);
  a.reservation = unless_empty(o.reservation);
  if (o.grace >= 0) a.grace_seconds = o.grace;
  a.reason = if_given(cmd, "--reason", o.reason);
  a.dry_run = o.dry_run;
  return one(
      s, [&](const std::string& n) { return terminate_spot_request(n, a); },
      [&](const json::value& b) -> std::expected<std::string, Failure> { return terminations_text(s, b); });
}

Result cmd_workloads(Session& s, const Options&, const CLI::App&) {
  return one(
      s, [&](const std::string& n) { return workloads_request(n); },
      [&](const json::value& b) -> std::expected<std::string, Failure> {
        auto list = s.decoded(decode_workloads(b));
        if (!list) return std::unexpected(list.error());
        return render_workloads(*list, s.style());
      });
}

void capacity_arguments(CLI::App& cmd, Options& o, Time) {
  cmd.add_option("ORG", o.org, "The org id")->required();
}

Result cmd_capacity(Session& s, const Options& o, const CLI::App&) {
  return one(
      s, [&](const std::string& n) { return capacity_request(n, o.org); },
      [&](const json::value& b) -> std::expected<std::string, Failure> {
        return render_capacity(b, s.style());
      });
}

void audit_arguments(CLI::App& cmd, Options& o, Time) {
  cmd.add_option("--after", o.after, "Records after this one (aud_N)");
  cmd.add_option("--limit", o.limit, "At most N records")
      ->check(CLI::Range(std::size_t{1}, std::size_t{10'000'000}));
  proof_arguments(cmd, o.proof);  // audit export, audit verify
}

Result cmd_audit(Session& s, const Options& o, const CLI::App& cmd) {
  if (cmd.got_subcommand("export") || cmd.got_subcommand("verify")) {
    const bool offline = cmd.got_subcommand("verify") && !o.proof.file.empty();
    std::string node;
    if (!offline) {
      auto n = s.node();
      if (!n) return s.fail(n.error());
      node = *n;
    }
    const ProofCall call = s.caller();
    return cmd.got_subcommand("export") ? audit_export(call, node, o.proof)
                                        : audit_verify(call, node, o.proof, s.env());
  }
  const auto after = unless_empty(o.after);
  std::optional<std::size_t> max;
  if (o.limit > 0) max = o.limit;
  return print_list(
      s, "records", max,
      [&](const std::string& node, const std::optional<std::string>& token, std::size_t limit) {
        return audit_page(node, after, limit, token);
      },
      [&](const json::value& doc) -> std::expected<std::string, Failure> {
        return render_audit(doc, s.style());
      });
}

// libvirt as the agent's metrics say (CONTRACT §6), else from whether it lists the workloads: in
// `v`, or the failure that ends the command (the agent unreachable).
std::optional<Failure> find_libvirt(Session& s, StatusView& v, std::optional<double> libvirt_up) {
  if (libvirt_up) {
    v.libvirt = *libvirt_up > 0 ? "connected" : "disconnected";
    return std::nullopt;
  }
  auto w = s.call(workloads_request(v.node_id));
  if (w) {
    v.libvirt = "connected";
  } else if (w.error().exit_code == kExitUnreachable) {
    return w.error();
  } else {
    v.libvirt = "disconnected";
    v.libvirt_detail = w.error().message;
    const auto colon = v.libvirt_detail.find(": ", std::string_view("gpunodectl: ").size());
    if (colon != std::string::npos) v.libvirt_detail = v.libvirt_detail.substr(colon + 2);
    while (!v.libvirt_detail.empty() && v.libvirt_detail.back() == '\n') v.libvirt_detail.pop_back();
  }
  return std::nullopt;
}

Result cmd_status(Session& s, const Options&, const CLI::App&) {
  auto st = s.state();
  if (!st) return s.fail(st.error());
  StatusView v;
  v.node_id = st->node_id;
  v.version = s.version().empty() ? "unknown" : s.version();
  v.revision = st->revision;
  v.state = std::move(*st);
  // The outbox and libvirt from the agent's metrics (CONTRACT §6) when it serves them; libvirt
  // otherwise from whether it lists the workloads.
  std::optional<double> libvirt_up;
  if (auto m = s.call(metrics_request(), false)) {
    v.outbox_depth = metric_value(m->raw, "gpunode_outbox_events");
    libvirt_up = metric_value(m->raw, "gpunode_libvirt_connected");
    v.ended = metric_value(m->raw, R"(gpunode_reservations{state="ended"})");
  } else if (m.error().exit_code == kExitUnreachable) {
    return s.fail(m.error());
  }
  if (auto f = find_libvirt(s, v, libvirt_up)) return s.fail(*f);
  if (s.json_out()) return Result{kExitOk, json::serialize(status_json(v)) + "\n", {}};
  return Result{kExitOk, render_status(v, s.style()), {}};
}

Result cmd_rescan(Session& s, const Options&, const CLI::App&) {
  auto a = s.call(rescan_request());
  if (!a) return s.fail(a.error());
  return s.print(*a, [&]() -> std::expected<std::string, Failure> {
    const auto* rev = field(a->doc, "revision").if_int64();
    return fmt::format("rescanned: revision {}\n", rev == nullptr ? std::string("?") : std::to_string(*rev));
  });
}

void health_args(CLI::App& cmd, Options& o, Time) {
  health_arguments(cmd, o.health);
}

Result cmd_health(Session& s, const Options& o, const CLI::App& cmd) {
  return health_command(s.caller(), cmd, o.health, s.json_out(), s.style());
}

void timeline_arguments(CLI::App& cmd, Options& o, Time) {
  cmd.add_option("--weeks", o.weeks, "How many weeks (default 4)")->check(CLI::Range(1, 520));
}

Result cmd_timeline(Session& s, const Options& o, const CLI::App&) {
  auto st = s.state();
  if (!st) return s.fail(st.error());
  const Time now = s.env().now;
  if (!s.json_out()) return Result{kExitOk, render_timeline(*st, now, o.weeks, s.env().width, s.style()), {}};
  // --json: the reservations drawn, as the agent wrote them, and the window.
  const Time from = std::chrono::floor<std::chrono::days>(now);
  const Time to = from + std::chrono::days(7 * o.weeks);
  json::array shown;
  const auto* raw = field(s.state_raw(), "reservations").if_array();
  for (std::size_t i = 0; raw != nullptr && i < raw->size() && i < st->reservations.size(); ++i) {
    const auto& r = st->reservations[i];
    if (r.state == "ended" || !r.starts || !r.ends || *r.starts >= to || *r.ends <= from) continue;
    shown.push_back((*raw)[i]);
  }
  json::array units;
  for (const auto& u : st->units) units.emplace_back(u.id);
  json::object doc{{"nodeId", st->node_id},
                   {"from", format_time(from)},
                   {"to", format_time(to)},
                   {"unitIds", std::move(units)},
                   {"reservations", std::move(shown)}};
  return Result{kExitOk, json::serialize(doc) + "\n", {}};
}

// ---- the command line ----------------------------------------------------------------------

// One gpunodectl command, described once: its name and summary (the help), its options, a usage
// check the parser cannot make (told before the socket is looked for), and its run.
struct Command {
  const char* name;
  const char* about;
  void (*arguments)(CLI::App& cmd, Options& o, Time now);
  Result (*run)(Session& s, const Options& o, const CLI::App& cmd);
  std::optional<Result> (*usage)(const CLI::App& cmd, const Options& o) = nullptr;
};

// In the order of the help.
const std::array<Command, 16> kCommands{{
    {"units",
     "The node's GPU units: a tree NUMA node -> unit -> devices, reservations "
     "and VMs (GET .../units with --json)",
     no_arguments, cmd_units},
    {"reservations", "List the node's reservations (every page)", reservations_arguments, cmd_reservations},
    {"reservation", "Show one reservation", reservation_arguments, cmd_reservation},
    {"reserve", "Reserve units for orgs (POST .../reservations)", reserve_arguments, cmd_reserve},
    {"amend", "Amend a reservation (PATCH; each list given replaces the old one whole)", amend_arguments,
     cmd_amend, amend_usage},
    {"end", "End a reservation now (its released units leave the spot market)", end_arguments, cmd_end},
    {"release", "Release units of an active reservation to the spot market", release_arguments, cmd_release},
    {"reclaim", "Take released units back from the spot market", reclaim_arguments, cmd_reclaim},
    {"terminate-spot", "Terminate spot VMs (only tier spot; every other VM is left running)",
     terminate_spot_arguments, cmd_terminate_spot},
    {"workloads", "The VMs on the node (libvirt domains) and their units", no_arguments, cmd_workloads},
    {"capacity", "What ORG may place on the node now, per unit and tier", capacity_arguments, cmd_capacity},
    {"audit",
     "The audit log, oldest first (every page, or --limit records); audit export, audit verify: the "
     "chain and its signed checkpoints",
     audit_arguments, cmd_audit},
    {"status",
     "The node at a glance: agent version, units by class, reservations by "
     "state, workloads, outbox, libvirt",
     no_arguments, cmd_status},
    {"rescan", "Rescan the host's GPUs now (POST /v1/admin/rescan)", no_arguments, cmd_rescan},
    {"timeline", "The reservations per unit over the coming weeks, drawn", timeline_arguments, cmd_timeline},
    {"health", "Each unit's health: state, reasons, each function's link; health clear UNIT --reason TEXT",
     health_args, cmd_health},
}};

constexpr const char* kAbout =
    "gpunodectl: operate the gpunode agent of this host over its admin socket.\n"
    "The socket is --socket, else admin.socket of /etc/gpunode/agent.yaml, else /run/gpunode/admin.sock.\n"
    "Times: RFC 3339 (2027-01-31T00:00:00Z) or + a duration from now (+30d, +12h, +90m; units w d h m s).\n"
    "Lists of ids are comma-separated. Exit status: 0 done, 1 the agent answered a problem,\n"
    "2 a usage error, 3 the socket is missing, unreachable or refuses the caller.";

// gpunodectl's options and its commands (kCommands' order), each command's CLI::App returned.
std::vector<CLI::App*> define_command_line(CLI::App& app, Options& o, Time now) {
  app.require_subcommand(1);
  app.fallthrough();
  app.set_help_all_flag("--help-all", "Show help for every command");
  app.add_option("--socket", o.socket,
                 "The agent's admin socket (default: admin.socket of /etc/gpunode/agent.yaml, else "
                 "/run/gpunode/admin.sock)");
  app.add_flag("--json", o.json,
               "Print the route's response body exactly (one JSON document; lists whole, every page)");
  app.add_flag_callback(
      "--version", [&] { throw CLI::Success(); }, "Print gpunodectl's version");
  std::vector<CLI::App*> commands;
  for (const auto& c : kCommands) {
    auto* cmd = app.add_subcommand(c.name, c.about);
    c.arguments(*cmd, o, now);
    commands.push_back(cmd);
  }
  return commands;
}

// A usage error: what the parser said, and the usage of the command named, else gpunodectl's.
Result usage_error(CLI::App& app, const std::vector<std::string>& args, const CLI::ParseError& e) {
  const CLI::App* named = &app;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--socket") {
      ++i;
    } else if (!args[i].starts_with('-')) {
      for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
        if (sub->get_name() == args[i]) named = sub;
      }
      break;
    }
  }
  return Result{
      kExitUsage,
      {},
      fmt::format("gpunodectl: {}\n\n{}", e.what(), named == &app ? app.help() : named->help("gpunodectl"))};
}

// Parses `args` into the options: nothing when a command is to run, else what to answer at once
// (help, the version, a usage error).
std::optional<Result> parse(CLI::App& app, const std::vector<std::string>& args, const Env& env) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    const auto subs = app.get_subcommands();
    return Result{kExitOk, subs.empty() ? app.help() : subs.front()->help("gpunodectl"), {}};
  } catch (const CLI::CallForAllHelp&) {
    return Result{kExitOk, app.help("", CLI::AppFormatMode::All), {}};
  } catch (const CLI::Success&) {  // --version
    return Result{kExitOk, fmt::format("gpunodectl {}\n", env.version), {}};
  } catch (const CLI::ParseError& e) {
    return usage_error(app, args, e);
  }
  return std::nullopt;
}

}  // namespace

Result run(const std::vector<std::string>& args, const Env& env) {
  Options o;
  CLI::App app{kAbout, "gpunodectl"};
  const auto commands = define_command_line(app, o, env.now);
  if (auto answer = parse(app, args, env)) return *answer;
  const auto chosen = std::find_if(commands.begin(), commands.end(), [](auto* c) { return c->parsed(); });
  const Command* command =
      chosen == commands.end() ? nullptr : &kCommands[static_cast<std::size_t>(chosen - commands.begin())];
  if (command != nullptr && command->usage != nullptr) {
    if (auto refused = command->usage(**chosen, o)) return *refused;
  }

  auto socket =
      choose_socket(o.socket, kDefaultConfig, o.socket ? std::nullopt : env.read_file(kDefaultConfig));
  if (!socket) return Result{kExitUnreachable, {}, fmt::format("gpunodectl: {}\n", socket.error().detail)};
  auto transport = env.connect(socket->path);
  Session s(*transport, env, o.json, Style{use_color(env.stdout_tty, env.no_color)});
  if (command == nullptr) return Result{kExitUsage, {}, app.help()};
  return command->run(s, o, **chosen);
}

}  // namespace gpunode::ctl
