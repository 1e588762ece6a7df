// Responses of POST /v1/responses kept for the server's lifetime, so a later request can
// continue one with `previous_response_id` (and GET /v1/responses/{id} can return it).
// Each entry holds only its own turn (the new input and the output, as chat messages)
// and the id of the response it continued; a conversation is rebuilt by following those
// links. Bounded: the oldest entries go first beyond kMaxEntries or kMaxBytes.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace step35::server {

class ResponseStore {
 public:
  static constexpr size_t kMaxEntries = 4096;
  static constexpr size_t kMaxBytes = size_t(64) << 20;

  struct Entry {
    std::string previous_id;      // "" at the start of a conversation
    nlohmann::json messages;      // this turn's input and output, as OpenAI chat messages
    nlohmann::json response;      // the response object
  };
  void put(const std::string& id, Entry entry);
  std::optional<nlohmann::json> response(const std::string& id) const;
  // Every message of the conversation that ends with response `id`, oldest first;
  // nullopt when `id` or a response it continued is no longer (or never was) here.
  std::optional<nlohmann::json> conversation(const std::string& id) const;
  bool erase(const std::string& id);

 private:
  static size_t size_of(const Entry& e);
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
  std::deque<std::string> order_;  // oldest first
  size_t bytes_ = 0;
};

}  // namespace step35::server
