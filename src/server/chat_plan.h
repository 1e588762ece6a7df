// A chat request turned into engine terms: the rendered prompt's tokens, sampling,
// constraint (response_format / forced tool calls), stop strings and output options.
// Shared by /v1/chat/completions, /v1/step35/execute and /v1/messages (which maps its
// Anthropic body to the OpenAI shape first).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/request_validation.h"
#include "server/server_context.h"

namespace step35::server {

// What the OpenAI endpoints share: the engine request and how the answer is shaped
// (`n` choices, streaming, usage in the stream, stop strings, the model name echoed).
struct ResponsePlan {
  GenerateRequest request;
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  std::vector<std::string> stops;
  std::string model;
};

// Reads `model`, `n`, `stream`, `stream_options` and `stop` (ApiError 400 naming the field).
void read_response_fields(ServerContext& ctx, Fields& f, ResponsePlan& plan);

struct ChatPlan : ResponsePlan {
  bool logprobs = false;
  bool in_reasoning = false;  // the prompt opened a think block
  nlohmann::json tools;  // declared tools (null: none, or tool_choice "none")
};

// Validates an OpenAI chat body (ApiError 400 naming the field) and plans it.
ChatPlan plan_chat(ServerContext& ctx, const nlohmann::json& body);

// The validation and planning step of the other endpoints, split from their handlers so
// each can be tested and fuzzed on its own (fuzz/fuzz_server_requests.cpp): every one
// either returns a plan within the server's limits or throws ApiError.

// POST /v1/completions.
struct CompletionsPlan : ResponsePlan {
  bool echo = false;
};
CompletionsPlan plan_completions(ServerContext& ctx, const nlohmann::json& body);

// POST /v1/messages: the Anthropic body in the OpenAI chat shape (then planned by plan_chat).
nlohmann::json anthropic_to_openai(const nlohmann::json& body);

// POST /v1/step35/execute: reads and removes the three step35 fields; the rest of the body
// is a chat request.
ExecuteOptions take_execute_options(ServerContext& ctx, nlohmann::json& body);

// POST /tokenize and /detokenize: the whole answer.
nlohmann::json tokenize_response(const ServerContext& ctx, const nlohmann::json& body);
nlohmann::json detokenize_response(const ServerContext& ctx, const nlohmann::json& body);

}  // namespace step35::server
