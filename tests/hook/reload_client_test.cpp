// `gpunode-agent reload` (CONTRACT §1, §11): the verdict on each answer the agent can give, or on
// why there is none. Exit 0 took, 1 refused (with the agent's reasons), 3 unreachable.
#include "reload_client.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "answers.hpp"

using gpunode::agent::reload_verdict;
using gpunode::ctl::Response;
using gpunode::ctl::TransportError;

using gpunode::test::answer;
using gpunode::test::failure;

TEST_CASE("reload: took -> 0, 'reloaded' on stdout; keys needing a restart named on stderr") {
  auto v = reload_verdict(answer(200, R"({"reloaded":true,"restartNeeded":[]})"), 0);
  CHECK(v.exit_code == 0);
  CHECK(v.out == std::vector<std::string>{"gpunode-agent reload: reloaded"});
  CHECK(v.err.empty());
  v = reload_verdict(answer(200, R"({"reloaded":true,"restartNeeded":["api.listen","state.dir"]})"), 0);
  CHECK(v.exit_code == 0);
  CHECK(v.err == std::vector<std::string>{"gpunode-agent reload: these changed keys take effect only after a "
                                          "restart: api.listen, state.dir"});
}

TEST_CASE("reload: 422 reload-refused -> 1 with each problem as FIELD: MESSAGE") {
  const auto v = reload_verdict(
      answer(422, R"({"type":"urn:gpunode:problem:reload-refused","code":"reload-refused","status":422,
      "title":"Reload refused","detail":"2 problems","errors":[{"field":"/etc/gpunode/agent.yaml:3:10","message":"invalid value"},
      {"field":"/etc/gpunode/agent.yaml:9:8","message":"/etc/gpunode/tls/agent.key: missing"}]})"),
      0);
  CHECK(v.exit_code == 1);
  CHECK(v.out.empty());
  CHECK(v.err ==
        std::vector<std::string>{"gpunode-agent reload: refused; the agent keeps its running configuration:",
                                 "/etc/gpunode/agent.yaml:3:10: invalid value",
                                 "/etc/gpunode/agent.yaml:9:8: /etc/gpunode/tls/agent.key: missing"});
}

TEST_CASE("reload: what the agent says reaches the terminal escaped") {
  const auto v = reload_verdict(
      answer(422,
             "{\"code\":\"reload-refused\",\"errors\":[{\"field\":\"f\",\"message\":\"\\u001b[2Jx\\ny\"}]}"),
      0);
  REQUIRE(v.err.size() == 2);
  CHECK(v.err[1] == "f: \\x1b[2Jx\\x0ay");
}

TEST_CASE(
    "reload: any other answer -> 1 with its status and detail; a 200 that is not a reload is not taken") {
  auto v = reload_verdict(answer(500, R"({"code":"internal","detail":"the reload failed"})"), 0);
  CHECK(v.exit_code == 1);
  CHECK(v.err == std::vector<std::string>{"gpunode-agent reload: the agent answered 500: the reload failed"});
  v = reload_verdict(answer(404, R"({"code":"not-found","detail":"no such resource"})"),
                     0);  // an agent without the route
  CHECK(v.exit_code == 1);
  v = reload_verdict(answer(200, R"({"status":"ok"})"), 0);
  CHECK(v.exit_code == 1);
  v = reload_verdict(answer(200, "not json"), 0);
  CHECK(v.exit_code == 1);
  CHECK(v.err == std::vector<std::string>{"gpunode-agent reload: the agent answered 200"});
}

TEST_CASE("reload: no answer -> 3 naming the socket and why") {
  for (auto kind :
       {TransportError::Kind::missing, TransportError::Kind::denied, TransportError::Kind::not_listening,
        TransportError::Kind::refused_peer, TransportError::Kind::timeout, TransportError::Kind::broken}) {
    const auto v =
        reload_verdict(std::unexpected(TransportError{kind, "/run/gpunode/admin.sock", "why"}), 998);
    CHECK(v.exit_code == 3);
    REQUIRE_FALSE(v.err.empty());
    CHECK(v.err[0].starts_with("gpunode-agent reload: "));
    CHECK(v.err[0].find("/run/gpunode/admin.sock") != std::string::npos);
  }
}
