#include "gpunode/service/shared_reads.hpp"

namespace gpunode::service {

bool SharedReads::eligible(const ApiRequest& q) {
  return q.via == ApiRequest::Via::https && q.method == "GET" && q.body.empty();
}

std::string SharedReads::key_of(const ApiRequest& q) {
  std::string key = q.path;
  key += '?';
  key += q.query;
  key += '\n';
  key += q.header("authorization").value_or("");
  return key;
}

std::optional<ApiResponse> SharedReads::find(const ApiRequest& q, TimePoint now) const {
  if (!eligible(q)) return std::nullopt;
  const std::string key = key_of(q);
  std::shared_ptr<const ApiResponse> answer;
  {
    std::lock_guard lock(mu_);
    auto it = kept_.find(key);
    if (it == kept_.end() || now >= it->second.until) return std::nullopt;
    answer = it->second.answer;
  }
  const auto etag = answer->header("ETag");
  if (answer->status == 304) return *answer;
  if (auto inm = q.header("if-none-match"); inm && etag && etag_matches(*inm, *etag)) {
    ApiResponse not_modified;
    not_modified.status = 304;
    not_modified.headers.emplace_back("ETag", std::string(*etag));
    return not_modified;
  }
  return *answer;
}

void SharedReads::keep(const ApiRequest& q, const ApiResponse& answer, TimePoint until) {
  if (!eligible(q) || (answer.status != 200 && answer.status != 304) || !answer.header("ETag")) return;
  auto kept = std::make_shared<const ApiResponse>(answer);
  std::string key = key_of(q);
  std::lock_guard lock(mu_);
  if (kept_.size() >= kMaxAnswers && !kept_.contains(key)) kept_.clear();
  kept_.insert_or_assign(std::move(key), Kept{std::move(kept), until});
}

void SharedReads::withdraw_all() {
  std::lock_guard lock(mu_);
  kept_.clear();
}

std::size_t SharedReads::size() const {
  std::lock_guard lock(mu_);
  return kept_.size();
}

}  // namespace gpunode::service
