// Lists followed to the end, and a misbehaving server stopped.
#include "gpunode/ctl/paging.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <map>

using namespace gpunode::ctl;
namespace json = boost::json;

namespace {

// A server holding `n` records, pages of at most `limit`; tokens are the last id of a page.
struct FakeList {
  explicit FakeList(int count) : n(count) {}
  int n = 0;
  std::vector<std::pair<std::optional<std::string>, std::size_t>> asked;

  std::expected<Page, Failure> operator()(const std::optional<std::string>& token, std::size_t limit) {
    asked.emplace_back(token, limit);
    int from = token ? std::stoi(token->substr(4)) : 0;
    json::array records;
    int last = from;
    for (int i = from + 1; i <= n && records.size() < limit; ++i) {
      records.emplace_back(json::object{{"id", fmt::format("aud_{}", i)}});
      last = i;
    }
    json::value next = last < n ? json::value(fmt::format("aud_{}", last)) : json::value(nullptr);
    json::object doc{{"records", records}, {"nextPageToken", next}};
    return Page{doc, json::serialize(doc)};
  }
};

}  // namespace

TEST_CASE("one page: the body as it came") {
  FakeList f{3};
  auto c = collect_pages("records", std::nullopt, std::ref(f));
  REQUIRE(c);
  CHECK(c->pages == 1);
  CHECK(c->raw == R"({"records":[{"id":"aud_1"},{"id":"aud_2"},{"id":"aud_3"}],"nextPageToken":null})");
  CHECK(f.asked.size() == 1);
  CHECK(f.asked[0].second == 500);
}

TEST_CASE("many pages: every entry, nextPageToken null, pages of 500") {
  FakeList f{1234};
  auto c = collect_pages("records", std::nullopt, std::ref(f));
  REQUIRE(c);
  CHECK(c->pages == 3);
  CHECK(c->raw.empty());
  CHECK(c->doc.at("records").as_array().size() == 1234);
  CHECK(c->doc.at("records").as_array().back().at("id") == "aud_1234");
  CHECK(c->doc.at("nextPageToken").is_null());
  REQUIRE(f.asked.size() == 3);
  CHECK(f.asked[1].first == "aud_500");
  CHECK(f.asked[2].first == "aud_1000");
}

TEST_CASE(
    "at most N entries: the last page asks for what is left, nextPageToken says where the rest starts") {
  FakeList f{1234};
  auto c = collect_pages("records", 700, std::ref(f));
  REQUIRE(c);
  CHECK(c->doc.at("records").as_array().size() == 700);
  CHECK(c->doc.at("nextPageToken") == "aud_700");
  REQUIRE(f.asked.size() == 2);
  CHECK(f.asked[1].second == 200);
  FakeList g{10};
  auto d = collect_pages("records", 2, std::ref(g));
  REQUIRE(d);
  CHECK(d->pages == 1);
  CHECK(d->raw == R"({"records":[{"id":"aud_1"},{"id":"aud_2"}],"nextPageToken":"aud_2"})");
  CHECK(g.asked[0].second == 2);
}

TEST_CASE("a misbehaving server is stopped, saying what it did") {
  auto page = [](json::value records, json::value next) {
    json::object doc{{"records", std::move(records)}, {"nextPageToken", std::move(next)}};
    return Page{doc, json::serialize(doc)};
  };
  int calls = 0;
  auto repeat = [&](const std::optional<std::string>&, std::size_t) -> std::expected<Page, Failure> {
    ++calls;
    return page(json::array{1}, "same");
  };
  auto r = collect_pages("records", std::nullopt, repeat);
  REQUIRE(!r);
  CHECK(r.error().exit_code == kExitProblem);
  CHECK(r.error().message == "gpunodectl: bad-answer: page 2 of the list: nextPageToken \"same\" repeats\n");
  CHECK(calls == 2);

  auto empty_more = [&](const std::optional<std::string>&, std::size_t) -> std::expected<Page, Failure> {
    return page(json::array{}, "t");
  };
  CHECK(collect_pages("records", std::nullopt, empty_more)
            .error()
            .message.find("an empty page promises more") != std::string::npos);

  int n = 0;
  auto endless = [&](const std::optional<std::string>&, std::size_t) -> std::expected<Page, Failure> {
    return page(json::array{1}, json::value(fmt::format("t{}", ++n)));
  };
  auto e = collect_pages("records", std::nullopt, endless, 50);
  REQUIRE(!e);
  CHECK(e.error().message.find("still more after 50 pages") != std::string::npos);
  CHECK(n == 50);

  auto wrong = [&](const std::optional<std::string>&, std::size_t) -> std::expected<Page, Failure> {
    return Page{json::object{{"items", 1}}, "{}"};
  };
  CHECK(collect_pages("records", std::nullopt, wrong).error().message ==
        "gpunodectl: bad-answer: page 1 of the list: no \"records\" array\n");
  auto bad_token = [&](const std::optional<std::string>&, std::size_t) -> std::expected<Page, Failure> {
    return page(json::array{1}, 7);
  };
  CHECK(collect_pages("records", std::nullopt, bad_token)
            .error()
            .message.find("nextPageToken is not a non-empty string") != std::string::npos);
  auto too_many = [&](const std::optional<std::string>&, std::size_t) -> std::expected<Page, Failure> {
    return page(json::array{1, 2, 3}, nullptr);
  };
  CHECK(collect_pages("records", 2, too_many).error().message.find("3 entries for a limit of 2") !=
        std::string::npos);
}

TEST_CASE("a failure of a page is the list's failure") {
  auto fails = [](const std::optional<std::string>&, std::size_t) -> std::expected<Page, Failure> {
    return std::unexpected(Failure{kExitUnreachable, "gpunodectl: no admin socket\n", {}});
  };
  auto r = collect_pages("records", std::nullopt, fails);
  REQUIRE(!r);
  CHECK(r.error().exit_code == kExitUnreachable);
}
