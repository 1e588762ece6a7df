// The server's stderr log: lifecycle lines (listening, the startup summary, ready,
// shutdown), one access line per request, and errors; as plain text lines
// ("step35 serve: ...") or, with `--log-format json`, one JSON object per line.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "server/server.h"

namespace step35::server {

class ServerLog {
 public:
  void configure(LogFormat format, bool access_log) {
    format_ = format;
    access_log_ = access_log;
  }
  // `text` for the text format; `fields` (plus "event" and "time") for JSON.
  void event(const char* event, const std::string& text, nlohmann::json fields = nlohmann::json::object());
  // One finished request: method, path, status, tokens (prompt_tokens < 0: none), time.
  void access(const std::string& method, const std::string& path, int status, int64_t prompt_tokens,
              int64_t completion_tokens, double ms);
  bool json() const { return format_ == LogFormat::Json; }

 private:
  std::mutex mu_;  // one line at a time
  LogFormat format_ = LogFormat::Text;
  bool access_log_ = true;
};

}  // namespace step35::server
