#include "server/server_log.h"

#include <chrono>
#include <cstdio>
#include <ctime>

namespace step35::server {

namespace {

// UTC with milliseconds, ISO 8601.
std::string timestamp() {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const std::time_t t = system_clock::to_time_t(now);
  const int ms = int(duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

}  // namespace

void ServerLog::event(const char* event, const std::string& text, nlohmann::json fields) {
  std::string line;
  if (format_ == LogFormat::Json) {
    nlohmann::json j = {{"time", timestamp()}, {"event", event}};
    for (auto it = fields.begin(); it != fields.end(); ++it) j[it.key()] = it.value();
    if (!j.contains("message")) j["message"] = text;
    line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  } else {
    line = "step35 serve: " + text + "\n";
  }
  std::lock_guard<std::mutex> lk(mu_);
  std::fputs(line.c_str(), stderr);
}

void ServerLog::access(const std::string& method, const std::string& path, int status, int64_t prompt_tokens,
                       int64_t completion_tokens, double ms) {
  if (!access_log_) return;
  char text[96];
  if (prompt_tokens >= 0) {
    std::snprintf(text, sizeof text, " %d %lld+%lld tokens %.0f ms", status, static_cast<long long>(prompt_tokens),
                  static_cast<long long>(completion_tokens), ms);
  } else {
    std::snprintf(text, sizeof text, " %d %.0f ms", status, ms);
  }
  nlohmann::json fields = {{"method", method}, {"path", path}, {"status", status}, {"ms", int64_t(ms + 0.5)}};
  if (prompt_tokens >= 0) {
    fields["prompt_tokens"] = prompt_tokens;
    fields["completion_tokens"] = completion_tokens;
  }
  event("request", method + " " + path + text, std::move(fields));
}

}  // namespace step35::server
