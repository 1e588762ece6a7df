#include "server/request_validation.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <random>

#include "server/api_error.h"
#include "structured/json_schema.h"

namespace step35::server {

using nlohmann::json;

// Every JSON body goes through here before it becomes a DOM (see kMaxJsonTextNesting).
void check_body_nesting(const std::string& body) {
  const size_t depth = grammar::json_text_depth(body, grammar::kMaxJsonTextNesting);
  if (depth > grammar::kMaxJsonTextNesting)
    throw ApiError(400, "the request body nests arrays and objects more than " +
                            std::to_string(grammar::kMaxJsonTextNesting) + " levels deep");
}

json parse_body(const std::string& body) {
  check_body_nesting(body);
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers past double
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

nlohmann::ordered_json parse_body_ordered(const std::string& body) {
  check_body_nesting(body);
  try {
    return nlohmann::ordered_json::parse(body);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
}

Fields::Fields(const json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {
  if (!obj_.is_object()) throw ApiError(400, "'" + (prefix_.empty() ? std::string("body") : prefix_) + "' must be an object");
}

void Fields::only(std::initializer_list<const char*> known) const {
  for (auto it = obj_.begin(); it != obj_.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) throw ApiError(400, "unknown field '" + prefix_ + it.key() + "'", prefix_ + it.key());
  }
}

bool Fields::has(const char* key) const {
  auto it = obj_.find(key);
  return it != obj_.end() && !it->is_null();
}

const json& Fields::raw(const char* key) const { return obj_.at(key); }

std::optional<bool> Fields::boolean(const char* key) const {
  if (!has(key)) return std::nullopt;
  const json& v = obj_.at(key);
  if (!v.is_boolean()) throw ApiError(400, "'" + name(key) + "' must be a boolean", name(key));
  return v.get<bool>();
}

std::optional<int64_t> Fields::integer(const char* key, int64_t lo, int64_t hi) const {
  if (!has(key)) return std::nullopt;
  const json& v = obj_.at(key);
  int64_t x;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      throw ApiError(400, "'" + name(key) + "' is out of range", name(key));
    x = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()) &&
             std::fabs(v.get<double>()) < 9e15) {
    x = int64_t(v.get<double>());
  } else {
    throw ApiError(400, "'" + name(key) + "' must be an integer", name(key));
  }
  if (x < lo || x > hi)
    throw ApiError(400, "'" + name(key) + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi),
                   name(key));
  return x;
}

std::optional<double> Fields::number(const char* key, double lo, double hi) const {
  if (!has(key)) return std::nullopt;
  const json& v = obj_.at(key);
  if (!v.is_number()) throw ApiError(400, "'" + name(key) + "' must be a number", name(key));
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "'%s' must be between %g and %g", name(key).c_str(), lo, hi);
    throw ApiError(400, buf, name(key));
  }
  return x;
}

std::optional<std::string> Fields::string(const char* key) const {
  if (!has(key)) return std::nullopt;
  const json& v = obj_.at(key);
  if (!v.is_string()) throw ApiError(400, "'" + name(key) + "' must be a string", name(key));
  return v.get<std::string>();
}

std::optional<std::string> Fields::choice(const char* key, std::initializer_list<const char*> allowed) const {
  auto s = string(key);
  if (!s) return s;
  std::string list;
  for (const char* a : allowed) {
    if (*s == a) return s;
    list += std::string(list.empty() ? "" : ", ") + "'" + a + "'";
  }
  throw ApiError(400, "'" + name(key) + "' must be one of " + list + " (got '" + *s + "')", name(key));
}

const json* Fields::object(const char* key) const {
  if (!has(key)) return nullptr;
  const json& v = obj_.at(key);
  if (!v.is_object()) throw ApiError(400, "'" + name(key) + "' must be an object", name(key));
  return &v;
}

const json* Fields::array(const char* key) const {
  if (!has(key)) return nullptr;
  const json& v = obj_.at(key);
  if (!v.is_array()) throw ApiError(400, "'" + name(key) + "' must be an array", name(key));
  return &v;
}

std::vector<std::string> Fields::strings_or_string(const char* key, size_t max) const {
  std::vector<std::string> out;
  if (!has(key)) return out;
  const json& v = obj_.at(key);
  auto add = [&](const json& s) {
    if (!s.is_string()) throw ApiError(400, "'" + name(key) + "' must be a string or an array of strings", name(key));
    if (s.get<std::string>().empty()) throw ApiError(400, "'" + name(key) + "' must not contain empty strings", name(key));
    out.push_back(s.get<std::string>());
  };
  if (v.is_array()) {
    for (const json& s : v) add(s);
  } else {
    add(v);
  }
  if (out.size() > max)
    throw ApiError(400, "'" + name(key) + "' may hold at most " + std::to_string(max) + " strings", name(key));
  return out;
}

SamplingParams sampling_from(const Fields& f, const SamplingParams& defaults, int32_t n_vocab) {
  SamplingParams sp = defaults;
  sp.temperature = float(f.number("temperature", 0.0, 2.0).value_or(defaults.temperature));
  sp.top_p = float(f.number("top_p", 0.0, 1.0).value_or(defaults.top_p));
  sp.top_k = int32_t(f.integer("top_k", 0, 1 << 20).value_or(defaults.top_k));
  sp.min_p = float(f.number("min_p", 0.0, 1.0).value_or(defaults.min_p));
  sp.typical_p = float(f.number("typical_p", 0.0, 1.0).value_or(defaults.typical_p));
  if (f.has("logit_bias")) {
    const nlohmann::json& lb = f.raw("logit_bias");
    if (!lb.is_object())
      throw ApiError(400, "'" + f.name("logit_bias") + "' must be an object of token id -> bias", f.name("logit_bias"));
    for (auto it = lb.begin(); it != lb.end(); ++it) {
      const std::string& key = it.key();
      char* end = nullptr;
      errno = 0;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || errno != 0 || id < 0 || id >= n_vocab)
        throw ApiError(400, "'" + f.name("logit_bias") + "' key '" + key + "' is not a token id in [0, " +
                                std::to_string(n_vocab) + ")", f.name("logit_bias"));
      if (!it.value().is_number() || !(it.value().get<double>() >= -100.0 && it.value().get<double>() <= 100.0))
        throw ApiError(400, "'" + f.name("logit_bias") + "' values must be numbers between -100 and 100",
                       f.name("logit_bias"));
      sp.logit_bias.emplace_back(int32_t(id), float(it.value().get<double>()));
    }
  }
  sp.presence_penalty = float(f.number("presence_penalty", -2.0, 2.0).value_or(defaults.presence_penalty));
  sp.frequency_penalty = float(f.number("frequency_penalty", -2.0, 2.0).value_or(defaults.frequency_penalty));
  sp.repeat_penalty = float(f.number("repetition_penalty", 0.0, 10.0).value_or(defaults.repeat_penalty));
  // OpenAI's penalties apply to everything generated so far (the last 4096 tokens here);
  // llama.cpp-style windows are an extension.
  sp.repeat_last_n = int32_t(f.integer("repeat_last_n", 0, 1 << 20).value_or(
      sp.presence_penalty != 0 || sp.frequency_penalty != 0 ? std::max(4096, defaults.repeat_last_n)
                                                              : defaults.repeat_last_n));
  if (auto seed = f.integer("seed", INT64_MIN, INT64_MAX)) {
    sp.seed = uint64_t(*seed);
  } else {
    sp.seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  return sp;
}

}  // namespace step35::server
