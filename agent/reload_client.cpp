// gpunode-agent reload (see reload_client.hpp).
#include "reload_client.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <sstream>

#include "gpunode/config/config.hpp"
#include "gpunode/text/printable.hpp"

namespace gpunode::agent {
namespace {

namespace json = boost::json;

std::string str(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string(v->get_string()) : std::string();
}

}  // namespace

ReloadVerdict reload_verdict(const std::expected<ctl::Response, ctl::TransportError>& answer, uid_t uid) {
  ReloadVerdict v;
  if (!answer) {
    v.exit_code = kReloadUnreachable;
    std::istringstream lines(ctl::describe(answer.error(), uid, "gpunode-agent reload"));
    for (std::string line; std::getline(lines, line);) v.err.push_back(line);
    return v;
  }
  const auto& r = *answer;
  boost::system::error_code ec;
  const auto body = json::parse(r.body, ec);
  const json::object* o = !ec ? body.if_object() : nullptr;
  if (r.status == 200 && o != nullptr && o->if_contains("reloaded") != nullptr && o->at("reloaded") == true) {
    v.out.push_back("gpunode-agent reload: reloaded");
    const auto* keys = o->if_contains("restartNeeded");
    if (keys != nullptr && keys->is_array() && !keys->get_array().empty()) {
      std::string names;
      for (const auto& k : keys->get_array()) {
        if (!k.is_string()) continue;
        names += (names.empty() ? "" : ", ") + text::printable(k.get_string());
      }
      v.err.push_back(fmt::format(
          "gpunode-agent reload: these changed keys take effect only after a restart: {}", names));
    }
    return v;
  }
  v.exit_code = kReloadRefused;
  if (r.status == 422 && o != nullptr && str(*o, "code") == "reload-refused") {
    v.err.push_back("gpunode-agent reload: refused; the agent keeps its running configuration:");
    const auto* errors = o->if_contains("errors");
    if (errors != nullptr && errors->is_array()) {
      for (const auto& e : errors->get_array()) {
        const auto* eo = e.if_object();
        if (eo == nullptr) continue;
        v.err.push_back(
            fmt::format("{}: {}", text::printable(str(*eo, "field")), text::printable(str(*eo, "message"))));
      }
    }
    return v;
  }
  v.err.push_back(fmt::format("gpunode-agent reload: the agent answered {}{}", r.status,
                              o != nullptr && !str(*o, "detail").empty()
                                  ? ": " + text::printable(str(*o, "detail"))
                                  : std::string()));
  return v;
}

ReloadVerdict run_reload(const std::string& config_file) {
  // A file with problems still gives its admin.socket when that key is valid (a bad value leaves the
  // default in its place): the agent is asked, and it names the problems.
  const std::string socket = config::load_file(config_file, config::Purpose::discover).config.admin.socket;
  ctl::Request q;
  q.method = "POST";
  q.target = "/v1/admin/reload";
  q.body = "{}";
  q.content_type = "application/json";
  q.timeout = kReloadBound;
  ctl::UnixClient client(socket, "gpunode-agent-reload");
  return reload_verdict(client.call(q), ::geteuid());
}

}  // namespace gpunode::agent
