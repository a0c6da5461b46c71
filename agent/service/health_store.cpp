// StateStore's unit health (CONTRACT §13): the tables `health_devices` and `health_units`
// (migration 5), read at open and written inside a change's transaction (HealthRows).
#include <fmt/format.h>

#include "gpunode/health/state_json.hpp"
#include "state_store.hpp"

namespace gpunode::service::detail {
namespace json = boost::json;
using store::DbError;

std::expected<void, DbError> StateStore::write_health(const Change& c, Tally&, Wall) {
  const auto run = [&](std::string_view sql, const auto&... args) -> std::expected<void, DbError> {
    auto st = cached(sql);
    if (!st) return std::unexpected(st.error());
    if (auto b = (*st)->bind_all(args...); !b) return std::unexpected(b.error());
    return (*st)->run();
  };
  for (const auto& [address, state] : c.health.devices) {
    if (auto w = run("INSERT OR REPLACE INTO health_devices (address, doc) VALUES (?1, ?2)", address,
                     json::serialize(health::to_json(state)));
        !w)
      return w;
  }
  for (const auto& address : c.health.devices_gone) {
    if (auto w = run("DELETE FROM health_devices WHERE address = ?1", address); !w) return w;
  }
  for (const auto& [unit, verdict] : c.health.units) {
    if (auto w = run("INSERT OR REPLACE INTO health_units (unit_id, doc) VALUES (?1, ?2)", unit,
                     json::serialize(health::to_json(verdict)));
        !w)
      return w;
  }
  return {};
}

// A row this agent did not write makes the state directory corrupt, as a reservation's would: a
// latched failure must not be forgotten silently.
std::expected<void, DbError> StateStore::load_health() {
  const std::string file = db_.path().string();
  for (const bool devices : {true, false}) {
    auto st = db_.prepare(devices ? "SELECT address, doc FROM health_devices"
                                  : "SELECT unit_id, doc FROM health_units");
    if (!st) return std::unexpected(st.error());
    for (;;) {
      auto step = st->step();
      if (!step) return std::unexpected(step.error());
      if (*step == store::Statement::Step::done) break;
      const std::string key = st->column_text(0);
      boost::system::error_code ec;
      const auto v = json::parse(st->column_text(1), ec);
      const auto bad = [&](const std::string& why) {
        return std::unexpected(store::corrupt(fmt::format("{}: health of {}: {}", file, key, why)));
      };
      if (ec) return bad("not JSON");
      if (devices) {
        auto s = health::device_state_from_json(v);
        if (!s) return bad(s.error().detail);
        loaded_.health_devices.emplace(key, std::move(*s));
      } else {
        auto r = health::verdict_from_json(v);
        if (!r) return bad(r.error().detail);
        loaded_.health_units.emplace(key, std::move(*r));
      }
    }
  }
  return {};
}

}  // namespace gpunode::service::detail
