// gpunode-agent libvirt-hook (see libvirt_hook.hpp).
#include "libvirt_hook.hpp"

#include <fmt/format.h>

#include <boost/json.hpp>

#include "gpunode/text/printable.hpp"
#include "hook_args.hpp"

namespace gpunode::agent {
namespace {

namespace json = boost::json;

constexpr std::chrono::seconds kAskBound{5};  // CONTRACT §9: the agent answers within 5 s or is down

// A domain too large to be asked about is refused, whatever when_agent_down says: the agent is not
// down, and whoever defines the domain chooses its size (metadata, a description), so `allow`
// must not let a padded domain start unasked.
HookVerdict oversized(const std::string& name, const std::string& what) {
  return {1,
          {text::printable(fmt::format("gpunode: domain {} refused: {}, over the {} bytes the agent takes",
                                       name, what, kAdmissionBodyLimit))}};
}

// The verdict when the agent cannot be asked.
HookVerdict agent_down(const std::string& socket, const std::string& why, config::WhenAgentDown when_down) {
  if (when_down == config::WhenAgentDown::allow) {
    return {0,
            {fmt::format("gpunode: agent unreachable at {}: {}; allowed (enforcement.when_agent_down: allow)",
                         text::printable(socket), text::printable(why))}};
  }
  return {
      1,
      {fmt::format("gpunode: agent unreachable at {}: {}", text::printable(socket), text::printable(why))}};
}

std::string str(const json::object& o, std::string_view key, std::string_view otherwise = "") {
  const auto* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string(v->get_string()) : std::string(otherwise);
}

}  // namespace

HookVerdict hook_verdict(const std::expected<ctl::Response, ctl::TransportError>& answer,
                         const std::string& socket, const std::string& name,
                         config::WhenAgentDown when_down) {
  if (!answer) {
    const auto& e = answer.error();
    std::string why;
    switch (e.kind) {
      case ctl::TransportError::Kind::missing:
        why = "no socket";
        break;
      case ctl::TransportError::Kind::denied:
        why = "permission denied";
        break;
      case ctl::TransportError::Kind::not_listening:
        why = "nobody listens on the socket";
        break;
      case ctl::TransportError::Kind::refused_peer:
        why = "the agent refused this caller";
        break;
      case ctl::TransportError::Kind::timeout:
        why = fmt::format("no answer within {} s", kAskBound.count());
        break;
      case ctl::TransportError::Kind::untrusted:
        why = "an untrusted server";
        break;
      case ctl::TransportError::Kind::broken:
        why = "the exchange failed";
        break;
    }
    if (!e.detail.empty()) why += " (" + e.detail + ")";
    return agent_down(socket, why, when_down);
  }
  const auto& r = *answer;
  boost::system::error_code ec;
  const auto body = json::parse(r.body, ec);
  const json::object* o = !ec ? body.if_object() : nullptr;
  // Anything but a decision is no decision (CONTRACT §9): a problem of any status (an agent that
  // cannot decide, one without the route, a body over its limit, a domain XML it cannot read)
  // follows when_agent_down, naming the status and the problem's code.
  if (r.status != 200) {
    const std::string code = o ? str(*o, "code") : std::string();
    const std::string detail = o ? str(*o, "detail") : std::string();
    return agent_down(socket,
                      fmt::format("answered {}{}{}", r.status, code.empty() ? "" : " " + code,
                                  detail.empty() ? "" : ": " + detail),
                      when_down);
  }
  const json::value* allowed = o ? o->if_contains("allowed") : nullptr;
  const json::value* reasons = o ? o->if_contains("reasons") : nullptr;
  if (allowed == nullptr || !allowed->is_bool() || reasons == nullptr || !reasons->is_array()) {
    return agent_down(socket, "its answer is not a domain admission", when_down);
  }
  if (allowed->get_bool()) return {};
  const std::string mode = str(*o, "mode", "enforce");
  HookVerdict v{mode == "enforce" ? 1 : 0, {}};
  for (const auto& rv : reasons->get_array()) {
    const json::object* reason = rv.if_object();
    if (reason == nullptr) continue;
    const std::string line = text::printable(fmt::format("{}: {}: {}", str(*reason, "unitId", "-"),
                                                         str(*reason, "code"), str(*reason, "message")));
    v.stderr_lines.push_back(mode == "enforce"
                                 ? fmt::format("gpunode: domain {} refused: {}", text::printable(name), line)
                                 : fmt::format("gpunode: domain {} would be refused ({} mode, let start): {}",
                                               text::printable(name), text::printable(mode), line));
  }
  if (v.stderr_lines.empty() && v.exit_code != 0)
    v.stderr_lines.push_back(fmt::format("gpunode: domain {} refused", text::printable(name)));
  return v;
}

HookVerdict run_libvirt_hook(const std::vector<std::string>& args,
                             const std::optional<std::string>& socket_flag,
                             const HookSettingsSource& settings_source, std::string_view domain_xml,
                             bool domain_xml_cut_short) {
  if (args.size() != 4)
    return {1, {"gpunode: libvirt-hook refuses: expected libvirt's NAME OPERATION SUB-OPERATION EXTRA"}};
  const std::string& name = args[0];
  if (!hook_asks(args[1], args[2])) return {};
  if (domain_xml_cut_short)
    return oversized(name, "its XML is larger");  // a hostdev may hide past the part read
  if (!may_have_pci_hostdev(domain_xml)) return {};

  const auto settings = settings_source();
  if (!settings) {
    // Neither the socket nor the answer for an agent that is down can be trusted: refuse.
    return {1,
            {text::printable(fmt::format("gpunode: domain {} refused: {}", name, settings.error().detail))}};
  }
  const std::string socket = socket_flag.value_or(settings->socket);

  ctl::Request q;
  q.method = "POST";
  q.target = "/v1/admin/domain-admission";
  q.body = json::serialize(json::object{{"domainXml", domain_xml}});
  q.content_type = "application/json";
  q.timeout = kAskBound;
  if (q.body.size() > kAdmissionBodyLimit) {  // the agent would answer 413 while this is still writing it
    return oversized(name, fmt::format("its admission request is {} bytes", q.body.size()));
  }
  ctl::UnixClient client(socket, "gpunode-libvirt-hook",
                         [&socket](int fd) { return ctl::vet_agent_socket(socket, fd); });
  return hook_verdict(client.call(q), socket, name, settings->when_agent_down);
}

}  // namespace gpunode::agent
