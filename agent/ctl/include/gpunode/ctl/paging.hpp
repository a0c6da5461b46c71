// gpunode/ctl/paging.hpp: lists followed to the end (CONTRACT §8), bounded. Pure: the pages come
// from a callback, so a misbehaving server (a token that repeats, an empty page that promises more,
// pages without end) is tested without one.
#pragma once

#include <boost/json/object.hpp>
#include <cstddef>
#include <expected>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "gpunode/ctl/outcome.hpp"

namespace gpunode::ctl {

inline constexpr std::size_t kPageSize = 500;     // the API's largest `limit`
inline constexpr std::size_t kMaxPages = 20'000;  // 10 million entries: past that, a server loops

struct Page {
  boost::json::value doc;  // the parsed body
  std::string raw;         // the body as it came
};

// Fetches one page: the previous page's nextPageToken (nullopt for the first) and the limit.
using FetchPage =
    std::function<std::expected<Page, Failure>(const std::optional<std::string>& token, std::size_t limit)>;

struct Collected {
  boost::json::object doc;  // {KEY: [every entry], "nextPageToken": null or where to go on}
  std::string raw;          // one page only: that page's body as it came; else empty
  std::size_t pages = 0;
};

// Pages until nextPageToken is null, or until `max_items` entries (then nextPageToken says where
// the rest starts). `key` is the list's key ("reservations", "records").
std::expected<Collected, Failure> collect_pages(std::string_view key, std::optional<std::size_t> max_items,
                                                const FetchPage& fetch, std::size_t max_pages = kMaxPages);

}  // namespace gpunode::ctl
