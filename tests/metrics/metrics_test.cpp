#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gpunode/metrics/exposition.hpp"
#include "gpunode/metrics/http_metrics.hpp"
#include "gpunode/metrics/node_metrics.hpp"

using namespace gpunode::metrics;
using namespace std::chrono_literals;

namespace {

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

std::size_t count_of(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("label values are escaped: backslash, double quote, line feed; nothing else") {
  CHECK(escape_label_value("plain") == "plain");
  CHECK(escape_label_value(R"(a\b)") == R"(a\\b)");
  CHECK(escape_label_value(R"(say "hi")") == R"(say \"hi\")");
  CHECK(escape_label_value("two\nlines") == R"(two\nlines)");
  CHECK(escape_label_value("tab\tand ünïcode") == "tab\tand ünïcode");
  Writer w;
  w.sample("m", {{"l", "x\"y\\z\n"}}, std::int64_t{3});
  CHECK(w.text() == "m{l=\"x\\\"y\\\\z\\n\"} 3\n");
}

TEST_CASE("values: integers exact, fractions shortest, the special values as Prometheus spells them") {
  CHECK(format_value(1.0) == "1");
  CHECK(format_value(0.25) == "0.25");
  CHECK(format_value(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(format_value(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(format_value(std::nan("")) == "NaN");
  Writer w;
  w.sample("c", {}, std::uint64_t{18446744073709551615ULL});
  w.sample("g", {}, std::int64_t{-2});
  CHECK(w.text() == "c 18446744073709551615\ng -2\n");
}

TEST_CASE("a family: HELP (escaped) then TYPE") {
  Writer w;
  w.family("x_total", "counter", "one\\two\nthree");
  CHECK(w.text() == "# HELP x_total one\\\\two\\nthree\n# TYPE x_total counter\n");
}

TEST_CASE("a histogram: cumulative buckets, +Inf equal to _count, _sum") {
  Writer w;
  const std::vector<double> bounds{0.1, 1, 10};
  const std::vector<std::uint64_t> counts{1, 2, 0, 3};  // the last: above 10
  w.histogram("d_seconds", {{"route", "/r"}}, bounds, counts, 42.5);
  CHECK(w.text() ==
        "d_seconds_bucket{route=\"/r\",le=\"0.1\"} 1\n"
        "d_seconds_bucket{route=\"/r\",le=\"1\"} 3\n"
        "d_seconds_bucket{route=\"/r\",le=\"10\"} 3\n"
        "d_seconds_bucket{route=\"/r\",le=\"+Inf\"} 6\n"
        "d_seconds_sum{route=\"/r\"} 42.5\n"
        "d_seconds_count{route=\"/r\"} 6\n");
}

TEST_CASE("route templates: every route of the API, ids never a label, the rest is other") {
  const std::vector<std::pair<std::string, std::string>> table = {
      {"/healthz", "/healthz"},
      {"/metrics", "/metrics"},
      {"/v1/admin/rescan", "/v1/admin/rescan"},
      {"/v1/admin/domain-admission", "/v1/admin/domain-admission"},
      {"/v1/admin/reload", "/v1/admin/reload"},
      {"/v1/admin/unentitled", "/v1/admin/unentitled"},
      {"/v1/admin/reload/x", "other"},
      {"/v1/nodes/node-1/units", "/v1/nodes/{nodeId}/units"},
      {"/v1/nodes/some-other-node/units", "/v1/nodes/{nodeId}/units"},
      {"/v1/nodes/n/reservations", "/v1/nodes/{nodeId}/reservations"},
      {"/v1/nodes/n/reservations/rsv_01m8y2stsy3mq2kbk29x4v6nh3",
       "/v1/nodes/{nodeId}/reservations/{reservationId}"},
      {"/v1/nodes/n/reservations/rsv_x/end", "/v1/nodes/{nodeId}/reservations/{reservationId}/end"},
      {"/v1/nodes/n/reservations/rsv_x/release", "/v1/nodes/{nodeId}/reservations/{reservationId}/release"},
      {"/v1/nodes/n/reservations/rsv_x/reclaim", "/v1/nodes/{nodeId}/reservations/{reservationId}/reclaim"},
      {"/v1/nodes/n/audit", "/v1/nodes/{nodeId}/audit"},
      {"/v1/nodes/n/audit/checkpoints", "/v1/nodes/{nodeId}/audit/checkpoints"},
      {"/v1/nodes/n/audit/other", "other"},
      {"/v1/nodes/n/state", "/v1/nodes/{nodeId}/state"},
      {"/v1/nodes/n/workloads", "/v1/nodes/{nodeId}/workloads"},
      {"/v1/nodes/n/capacity", "/v1/nodes/{nodeId}/capacity"},
      {"/v1/nodes/n/admission", "/v1/nodes/{nodeId}/admission"},
      {"/v1/nodes/n/terminate-spot", "/v1/nodes/{nodeId}/terminate-spot"},
      {"/v1/orgs/org-acme/reserved-capacity", "/v1/orgs/{orgId}/reserved-capacity"},
      // unknown paths collapse into one value
      {"/", "other"},
      {"", "other"},
      {"/favicon.ico", "other"},
      {"/v1/nodes/n/units/", "other"},
      {"/v1/nodes//units", "other"},
      {"/v1/nodes/n/reservations//end", "other"},
      {"/v1/nodes/n/reservations/rsv_x/destroy", "other"},
      {"/v1/nodes/n/reservations/rsv_x/end/more", "other"},
      {"/v1/nodes/n/anything-at-all-0123456789", "other"},
      {"/v1/orgs/o/reserved-capacity/x", "other"},
      {"/v2/nodes/n/units", "other"},
      {"/v1/nodes/n/%75nits", "other"},
      {"v1/nodes/n/units", "other"},
  };
  for (const auto& [path, want] : table) {
    CAPTURE(path);
    CHECK(route_template(path) == want);
  }
}

TEST_CASE("method labels: the seven methods, anything else other") {
  CHECK(method_label("GET") == "GET");
  CHECK(method_label("PATCH") == "PATCH");
  CHECK(method_label("OPTIONS") == "OPTIONS");
  CHECK(method_label("get") == "other");
  CHECK(method_label("PROPFIND") == "other");
  CHECK(method_label("") == "other");
}

TEST_CASE("HTTP metrics: counted by route template, method and code; durations in cumulative buckets") {
  HttpMetrics m;
  m.record("GET", "/v1/nodes/a/units", 200, 200us);
  m.record("GET", "/v1/nodes/b/units", 200, 1ms);  // on a bound: counted in it (le is inclusive)
  m.record("GET", "/v1/nodes/a/units", 404, 3ms);
  m.record("BREW", "/coffee", 418, 400s);  // above the last bound: +Inf only
  m.record("", "", 413, 0ns);              // the server's own answer to an unread request
  m.record("GET", "/healthz", 999, 1ms);   // a status out of range: code other
  Writer w;
  m.write(w);
  const auto t = w.take();
  CHECK(has_line(t, "# TYPE gpunode_http_requests_total counter"));
  CHECK(has_line(t, "# TYPE gpunode_http_request_duration_seconds histogram"));
  CHECK(has_line(
      t, R"(gpunode_http_requests_total{route="/v1/nodes/{nodeId}/units",method="GET",code="200"} 2)"));
  CHECK(has_line(
      t, R"(gpunode_http_requests_total{route="/v1/nodes/{nodeId}/units",method="GET",code="404"} 1)"));
  CHECK(has_line(t, R"(gpunode_http_requests_total{route="other",method="other",code="418"} 1)"));
  CHECK(has_line(t, R"(gpunode_http_requests_total{route="other",method="other",code="413"} 1)"));
  CHECK(has_line(t, R"(gpunode_http_requests_total{route="/healthz",method="GET",code="other"} 1)"));
  const std::string units =
      R"(gpunode_http_request_duration_seconds_bucket{route="/v1/nodes/{nodeId}/units",method="GET",le=)";
  CHECK(has_line(t, units + R"("0.0005"} 1)"));
  CHECK(has_line(t, units + R"("0.001"} 2)"));
  CHECK(has_line(t, units + R"("0.0025"} 2)"));
  CHECK(has_line(t, units + R"("0.005"} 3)"));
  CHECK(has_line(t, units + R"("300"} 3)"));
  CHECK(has_line(t, units + R"("+Inf"} 3)"));
  const std::string sum =
      R"(gpunode_http_request_duration_seconds_sum{route="/v1/nodes/{nodeId}/units",method="GET"} )";
  const auto at = t.find("\n" + sum);
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(t.substr(at + 1 + sum.size())) == doctest::Approx(0.0042).epsilon(1e-9));
  CHECK(has_line(
      t, R"(gpunode_http_request_duration_seconds_count{route="/v1/nodes/{nodeId}/units",method="GET"} 3)"));
  const std::string other =
      R"(gpunode_http_request_duration_seconds_bucket{route="other",method="other",le=)";
  CHECK(has_line(t, other + R"("300"} 1)"));  // the 413 took 0 s
  CHECK(has_line(t, other + R"("+Inf"} 2)"));
  CHECK(t.find("node-") == std::string::npos);
  CHECK(t.find("/v1/nodes/a") == std::string::npos);
}

TEST_CASE("HTTP metrics from several threads: nothing lost (TSan-clean under make test-tsan)") {
  HttpMetrics m;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&m, t] {
      for (int i = 0; i < 1000; ++i) {
        m.record("GET", t % 2 ? "/healthz" : "/v1/nodes/n/state", 200, 1ms);
        if (i % 100 == 0) {
          Writer w;
          m.write(w);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  Writer w;
  m.write(w);
  const auto t = w.take();
  CHECK(has_line(t, R"(gpunode_http_requests_total{route="/healthz",method="GET",code="200"} 2000)"));
  CHECK(has_line(
      t, R"(gpunode_http_requests_total{route="/v1/nodes/{nodeId}/state",method="GET",code="200"} 2000)"));
}

TEST_CASE("the whole body: every family of CONTRACT 6 with HELP and TYPE, fixed label sets at 0") {
  Snapshot s;
  s.version = "1.2.3";
  s.node.units[0][1] = 3;  // vfio-group reservable
  s.node.units[2][0] = 2;  // none, not reservable
  s.node.reservations[1] = 4;
  s.node.revision = 17;
  s.node.discovery_seconds = 0.0125;
  s.node.terminations_ok = 5;
  s.node.count_admission(Admission::audit_refused);
  s.delivery.outbox_events = 9;
  s.delivery.oldest_undelivered_age_seconds = 61.5;
  s.delivery.acked_seq = 120;
  s.delivery.failures[1] = 7;  // 5xx
  s.libvirt_connected = true;
  HttpMetrics http;
  const auto t = render(s, http);
  const std::vector<std::pair<std::string, std::string>> families = {
      {"gpunode_build_info", "gauge"},
      {"gpunode_units", "gauge"},
      {"gpunode_reservations", "gauge"},
      {"gpunode_http_requests_total", "counter"},
      {"gpunode_http_request_duration_seconds", "histogram"},
      {"gpunode_terminations_total", "counter"},
      {"gpunode_outbox_events", "gauge"},
      {"gpunode_outbox_oldest_undelivered_age_seconds", "gauge"},
      {"gpunode_central_acked_seq", "gauge"},
      {"gpunode_central_delivery_failures_total", "counter"},
      {"gpunode_libvirt_connected", "gauge"},
      {"gpunode_state_revision", "gauge"},
      {"gpunode_discovery_duration_seconds", "gauge"},
      {"gpunode_domain_admissions_total", "counter"},
  };
  for (const auto& [name, type] : families) {
    CAPTURE(name);
    CHECK(has_line(t, "# TYPE " + name + " " + type));
    CHECK(count_of(t, "# HELP " + name + " ") == 1);
  }
  CHECK(has_line(t, R"(gpunode_build_info{version="1.2.3"} 1)"));
  CHECK(has_line(t, R"(gpunode_units{class="vfio-group",reservable="true"} 3)"));
  CHECK(has_line(t, R"(gpunode_units{class="vfio-group",reservable="false"} 0)"));
  CHECK(has_line(t, R"(gpunode_units{class="device-request",reservable="true"} 0)"));
  CHECK(has_line(t, R"(gpunode_units{class="none",reservable="false"} 2)"));
  CHECK(count_of(t, "\ngpunode_units{") == 6);
  CHECK(has_line(t, R"(gpunode_reservations{state="scheduled"} 0)"));
  CHECK(has_line(t, R"(gpunode_reservations{state="active"} 4)"));
  CHECK(has_line(t, R"(gpunode_reservations{state="ended"} 0)"));
  CHECK(has_line(t, R"(gpunode_terminations_total{result="ok"} 5)"));
  CHECK(has_line(t, R"(gpunode_terminations_total{result="failed"} 0)"));
  CHECK(has_line(t, "gpunode_outbox_events 9"));
  CHECK(has_line(t, "gpunode_outbox_oldest_undelivered_age_seconds 61.5"));
  CHECK(has_line(t, "gpunode_central_acked_seq 120"));
  CHECK(has_line(t, R"(gpunode_central_delivery_failures_total{reason="transport"} 0)"));
  CHECK(has_line(t, R"(gpunode_central_delivery_failures_total{reason="5xx"} 7)"));
  CHECK(has_line(t, R"(gpunode_central_delivery_failures_total{reason="429"} 0)"));
  CHECK(has_line(t, R"(gpunode_central_delivery_failures_total{reason="4xx"} 0)"));
  CHECK(has_line(t, "gpunode_libvirt_connected 1"));
  CHECK(has_line(t, "gpunode_state_revision 17"));
  CHECK(has_line(t, "gpunode_discovery_duration_seconds 0.0125"));
  CHECK(has_line(t, R"(gpunode_domain_admissions_total{result="allowed"} 0)"));
  CHECK(has_line(t, R"(gpunode_domain_admissions_total{result="refused"} 0)"));
  CHECK(has_line(t, R"(gpunode_domain_admissions_total{result="audit-refused"} 1)"));
  CHECK(t.back() == '\n');
}

TEST_CASE("index_of finds a label value's slot") {
  CHECK(index_of(kUnitClasses, "device-request") == 1);
  CHECK(index_of(kReservationStates, "ended") == 2);
  CHECK(index_of(kFailureReasons, "429") == 2);
  CHECK_FALSE(index_of(kUnitClasses, "gpu").has_value());
}
