#include "gpunode/ctl/paging.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <boost/json/array.hpp>

namespace gpunode::ctl {
namespace json = boost::json;

namespace {
Failure bad_page(std::size_t page, std::string_view what) {
  return Failure{
      kExitProblem, fmt::format("gpunodectl: bad-answer: page {} of the list: {}\n", page, what), {}};
}
}  // namespace

std::expected<Collected, Failure> collect_pages(std::string_view key, std::optional<std::size_t> max_items,
                                                const FetchPage& fetch, std::size_t max_pages) {
  Collected out;
  json::array all;
  std::optional<std::string> token;
  json::value next = nullptr;
  while (true) {
    if (out.pages == max_pages)
      return std::unexpected(
          bad_page(out.pages, fmt::format("still more after {} pages; stopped", max_pages)));
    std::size_t limit = kPageSize;
    if (max_items) limit = std::min(limit, *max_items - all.size());
    auto page = fetch(token, limit);
    if (!page) return std::unexpected(page.error());
    ++out.pages;
    const auto* obj = page->doc.if_object();
    const auto* list = obj == nullptr ? nullptr : obj->if_contains(key);
    if (list == nullptr || !list->is_array())
      return std::unexpected(bad_page(out.pages, fmt::format("no \"{}\" array", key)));
    const auto& items = list->get_array();
    if (items.size() > limit)
      return std::unexpected(
          bad_page(out.pages, fmt::format("{} entries for a limit of {}", items.size(), limit)));
    for (const auto& x : items) all.push_back(x);
    next = nullptr;
    if (const auto* n = obj->if_contains("nextPageToken"); n != nullptr && !n->is_null()) {
      const auto* s = n->if_string();
      if (s == nullptr || s->empty())
        return std::unexpected(bad_page(out.pages, "nextPageToken is not a non-empty string"));
      if (token && *token == *s)
        return std::unexpected(
            bad_page(out.pages, fmt::format("nextPageToken \"{}\" repeats", std::string_view(*s))));
      if (items.empty()) return std::unexpected(bad_page(out.pages, "an empty page promises more"));
      next = *s;
      token = std::string(*s);
    }
    if (out.pages == 1) out.raw = std::move(page->raw);
    if (next.is_null() || (max_items && all.size() >= *max_items)) break;
  }
  if (out.pages > 1) out.raw.clear();
  out.doc = json::object{{key, std::move(all)}, {"nextPageToken", next}};
  return out;
}

}  // namespace gpunode::ctl
