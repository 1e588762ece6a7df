// What every endpoint handler shares: the model, engine, chat template, options and
// metrics. Internal to src/server.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "model/step35.h"
#include "engine/engine.h"
#include "server/hotswap.h"
#include "server/metrics.h"
#include "server/server.h"
#include "chat/chat_template.h"

namespace step35::server {

struct ServerContext {
  ServerOptions options;
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<ChatTemplate> chat_template;
  int32_t think_end = -1;  // the `</think>` token, -1 when the vocabulary has none
  ServerMetrics metrics;
  HotSwapState hotswap;
  std::atomic<bool> ready{false};
  std::atomic<bool> draining{false};
  std::atomic<int> in_flight{0};

  const Tokenizer& tokenizer() const { return model->tokenizer(); }
};

// POST /v1/step35/execute extensions applied to a chat request.
struct ExecuteOptions {
  std::string routing_hint;       // as asked ("" when absent)
  Priority priority = Priority::Normal;
  int32_t context_window = 0;     // 0: the engine's
  std::string expert_policy = "auto";  // as asked
  ExpertPolicy applied_policy = ExpertPolicy::Strict;
};

void handle_chat(ServerContext& ctx, nlohmann::json body, const ExecuteOptions* exec, httplib::Response& res);
void handle_completions(ServerContext& ctx, const nlohmann::json& body, httplib::Response& res);
void handle_execute(ServerContext& ctx, nlohmann::json body, httplib::Response& res);
void handle_messages(ServerContext& ctx, const nlohmann::json& body, httplib::Response& res);
// Hot-swap (server/hotswap.cpp): POST /v1/step35/hotswap, POST /v1/step35/hotswap/revert,
// GET /v1/step35/hotswap (the active patches), and the /metrics lines.
void handle_hotswap(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_hotswap_revert(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_hotswap_list(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
std::string hotswap_metrics(ServerContext& ctx);

// Shared by the handlers.
void set_json(httplib::Response& res, const nlohmann::json& body, int status = 200);
// Starts an SSE response whose body `produce` writes (returns false if the client left).
void set_event_stream(ServerContext& ctx, httplib::Response& res, std::function<void(httplib::DataSink&)> produce);
std::string random_id(const char* prefix);
int64_t unix_time();

}  // namespace step35::server
