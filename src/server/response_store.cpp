#include "server/response_store.h"

#include <algorithm>
#include <vector>

namespace step35::server {

size_t ResponseStore::size_of(const Entry& e) {
  // (Generated text may hold invalid UTF-8: dumped with replacement, as it is sent.)
  const auto replace = nlohmann::json::error_handler_t::replace;
  return e.previous_id.size() + e.messages.dump(-1, ' ', false, replace).size() +
         e.response.dump(-1, ' ', false, replace).size();
}

void ResponseStore::put(const std::string& id, Entry entry) {
  std::lock_guard<std::mutex> lk(mu_);
  if (entries_.count(id)) return;  // ids are random: a repeat would be a bug upstream
  bytes_ += size_of(entry);
  entries_.emplace(id, std::move(entry));
  order_.push_back(id);
  while (!order_.empty() && (entries_.size() > kMaxEntries || bytes_ > kMaxBytes)) {
    const auto it = entries_.find(order_.front());
    if (it != entries_.end()) {
      bytes_ -= size_of(it->second);
      entries_.erase(it);
    }
    order_.pop_front();
  }
}

std::optional<nlohmann::json> ResponseStore::response(const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.response;
}

std::optional<nlohmann::json> ResponseStore::conversation(const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<const Entry*> chain;
  for (std::string at = id; !at.empty();) {
    const auto it = entries_.find(at);
    if (it == entries_.end() || chain.size() > entries_.size()) return std::nullopt;
    chain.push_back(&it->second);
    at = it->second.previous_id;
  }
  nlohmann::json messages = nlohmann::json::array();
  for (auto e = chain.rbegin(); e != chain.rend(); ++e)
    for (const auto& m : (*e)->messages) messages.push_back(m);
  return messages;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  bytes_ -= size_of(it->second);
  entries_.erase(it);
  order_.erase(std::remove(order_.begin(), order_.end(), id), order_.end());
  return true;
}

}  // namespace step35::server
