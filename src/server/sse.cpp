#include "server/sse.h"

namespace step35::server {

using nlohmann::json;

// dump() with replace: invalid UTF-8 in generated text (a token cut mid-character at the
// end) becomes U+FFFD instead of an exception.
std::string sse_data(const json& payload) {
  return "data: " + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string sse_event(const std::string& event, const json& payload) {
  return "event: " + event + "\n" + sse_data(payload);
}

bool sse_write(httplib::DataSink& sink, const std::string& frame) {
  return sink.is_writable() && sink.write(frame.data(), frame.size());
}

}  // namespace step35::server
