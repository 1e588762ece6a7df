// Server-sent events framing (text/event-stream): `data: JSON\n\n` chunks, OpenAI's
// final `data: [DONE]`, and Anthropic's named `event:` lines.
#pragma once

#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace step35::server {

std::string sse_data(const nlohmann::json& payload);
std::string sse_event(const std::string& event, const nlohmann::json& payload);
inline const char* sse_done() { return "data: [DONE]\n\n"; }
// Writes one frame; false when the client has gone.
bool sse_write(httplib::DataSink& sink, const std::string& frame);

}  // namespace step35::server
