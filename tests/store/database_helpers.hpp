// What the store's tests do to a Database at every turn: open it, run SQL, read one number, each
// failing the test with SQLite's message.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "gpunode/store/database.hpp"

namespace gpunode::test {

inline store::Database open_ok(const std::filesystem::path& file) {
  auto db = store::Database::open(file);
  REQUIRE_MESSAGE(db.has_value(), (db ? std::string() : db.error().detail));
  return std::move(*db);
}

inline void exec_ok(store::Database& db, std::string_view sql) {
  auto r = db.exec(sql);
  REQUIRE_MESSAGE(r.has_value(), (r ? std::string() : r.error().detail));
}

inline std::int64_t query_int(store::Database& db, std::string_view sql) {
  auto st = db.prepare(sql);
  REQUIRE_MESSAGE(st.has_value(), (st ? std::string() : st.error().detail));
  auto row = st->step();
  REQUIRE(row.has_value());
  REQUIRE(*row == store::Statement::Step::row);
  return st->column_int64(0);
}

}  // namespace gpunode::test
