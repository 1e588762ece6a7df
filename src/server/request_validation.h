// Reading request bodies: JSON parsing, typed field access with OpenAI-style 400 errors
// naming the field, unknown-field rejection, and the sampling fields shared by the
// chat, completions, messages and execute endpoints.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "server/server.h"

namespace step35::server {

// Parses a request body as one JSON object (ApiError 400 otherwise).
nlohmann::json parse_body(const std::string& body);
// The same body with its objects in the client's key order (call after parse_body, which
// reports the errors).
nlohmann::ordered_json parse_body_ordered(const std::string& body);

// Typed access to one JSON object's members; every error is an ApiError(400) naming
// the member (with `prefix`, e.g. "stream_options.").
class Fields {
 public:
  Fields(const nlohmann::json& obj, std::string prefix = "");
  // Rejects members outside `known` (400 "unknown field").
  void only(std::initializer_list<const char*> known) const;
  bool has(const char* key) const;  // present and not null
  const nlohmann::json& raw(const char* key) const;
  std::optional<bool> boolean(const char* key) const;
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) const;
  std::optional<double> number(const char* key, double lo, double hi) const;
  std::optional<std::string> string(const char* key) const;
  // A string that must be one of `allowed`.
  std::optional<std::string> choice(const char* key, std::initializer_list<const char*> allowed) const;
  const nlohmann::json* object(const char* key) const;
  const nlohmann::json* array(const char* key) const;
  // "stop": a string or an array of at most `max` non-empty strings.
  std::vector<std::string> strings_or_string(const char* key, size_t max) const;
  std::string name(const char* key) const { return prefix_ + key; }

 private:
  const nlohmann::json& obj_;
  std::string prefix_;
};

// The sampling fields common to the OpenAI endpoints: temperature, top_p, top_k, min_p,
// typical_p, seed, presence/frequency/repetition penalties and their window, logit_bias
// ({"token id": bias -100..100}, ids checked against `n_vocab`). What a request leaves out
// comes from `defaults` (the server's flags; OpenAI's values unless set). A random seed
// when none is given.
SamplingParams sampling_from(const Fields& f, const SamplingParams& defaults, int32_t n_vocab);

}  // namespace step35::server
