// A chat request turned into engine terms: the rendered prompt's tokens, sampling,
// constraint (response_format / forced tool calls), stop strings and output options.
// Shared by /v1/chat/completions, /v1/step35/execute and /v1/messages (which maps its
// Anthropic body to the OpenAI shape first).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine.h"
#include "server/server_context.h"

namespace step35::server {

struct ChatPlan {
  GenerateRequest request;
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  bool in_reasoning = false;  // the prompt opened a think block
  std::vector<std::string> stops;
  std::string model;
  nlohmann::json tools;  // declared tools (null: none, or tool_choice "none")
};

// Validates an OpenAI chat body (ApiError 400 naming the field) and plans it.
ChatPlan plan_chat(ServerContext& ctx, const nlohmann::json& body);

}  // namespace step35::server
