// What every endpoint handler shares: the model, engine, chat template, options, metrics,
// the log and the stored responses. Internal to src/server.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "engine/engine.h"
#include "exec/thread_pool.h"
#include "model/step35.h"
#include "server/hotswap.h"
#include "server/metrics.h"
#include "server/response_store.h"
#include "server/server.h"
#include "server/server_log.h"
#include "vision/embedding_cache.h"
#include "vision/step3vl_encoder.h"

namespace step35::server {

struct ServerContext {
  ServerOptions options;
  std::unique_ptr<Model> model;
  // The vision tower (--mmproj; null without) and the threads that encode pictures, one
  // request's pictures at a time (server/chat_images.h).
  std::unique_ptr<vision::Step3vlEncoder> mmproj;
  std::unique_ptr<ThreadPool> vision_pool;
  std::mutex vision_mu;
  std::unique_ptr<vision::EmbeddingCache> image_cache;  // --image-cache (null: off)
  std::unique_ptr<Engine> engine;
  std::unique_ptr<ChatTemplate> chat_template;
  int32_t think_end = -1;  // the `</think>` token, -1 when the vocabulary has none
  ServerMetrics metrics;
  ServerLog log;
  ResponseStore responses;  // /v1/responses, for previous_response_id
  HotSwapState hotswap;     // POST /v1/step35/hotswap: the patches swapped in
  std::atomic<bool> ready{false};
  std::atomic<bool> draining{false};
  std::atomic<int> in_flight{0};

  const Tokenizer& tokenizer() const { return model->tokenizer(); }

  // A model that failed to load: /health reports it until the process exits.
  void set_load_error(const std::string& message) {
    std::lock_guard<std::mutex> lk(load_error_mu_);
    load_error_ = message;
  }
  std::string load_error() const {
    std::lock_guard<std::mutex> lk(load_error_mu_);
    return load_error_;
  }

 private:
  mutable std::mutex load_error_mu_;
  std::string load_error_;
};

// One HTTP exchange as a handler sees it: the request, the response it fills, and what
// the access log line will say about it.
struct RequestTrace {
  std::string method, path;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  int status = 0;
  int64_t prompt_tokens = -1;      // -1: not a generation
  int64_t completion_tokens = 0;
  bool streaming = false;          // the line is written when the stream ends
};

struct HttpExchange {
  const httplib::Request& req;
  httplib::Response& res;
  std::shared_ptr<RequestTrace> trace;
  // The JSON body in the client's key order (nlohmann::json sorts object keys), for what
  // reaches the chat template: messages, tool definitions, tool-call arguments. Set by
  // the endpoints that render a chat; null elsewhere.
  const nlohmann::ordered_json* ordered_body = nullptr;
};

// POST /v1/step35/execute extensions applied to a chat request.
struct ExecuteOptions {
  std::string routing_hint;       // as asked ("" when absent)
  Priority priority = Priority::Normal;
  int32_t context_window = 0;     // 0: the engine's
  std::string expert_policy = "auto";  // as asked
  ExpertPolicy applied_policy = ExpertPolicy::Strict;
};

void handle_chat(ServerContext& ctx, nlohmann::json body, const ExecuteOptions* exec, HttpExchange& ex);
void handle_completions(ServerContext& ctx, const nlohmann::json& body, HttpExchange& ex);
void handle_execute(ServerContext& ctx, nlohmann::json body, HttpExchange& ex);
void handle_messages(ServerContext& ctx, const nlohmann::json& body, HttpExchange& ex);
void handle_count_tokens(ServerContext& ctx, const nlohmann::json& body, HttpExchange& ex);
void handle_responses(ServerContext& ctx, const nlohmann::json& body, HttpExchange& ex);
// POST /apply-template (llama-server's): a chat completion's body, answered with the
// prompt it renders to, {"prompt": ...}.
void handle_apply_template(ServerContext& ctx, const nlohmann::json& body, HttpExchange& ex);
// Hot-swap (server/hotswap.cpp): POST /v1/step35/hotswap, POST /v1/step35/hotswap/revert,
// GET /v1/step35/hotswap (the active patches), and the /metrics lines.
void handle_hotswap(ServerContext& ctx, const std::string& body, HttpExchange& ex);
void handle_hotswap_revert(ServerContext& ctx, const std::string& body, HttpExchange& ex);
void handle_hotswap_list(ServerContext& ctx, HttpExchange& ex);
std::string hotswap_metrics(ServerContext& ctx);
// The --patch files (options.patches), checked against the loaded model and installed;
// throws std::runtime_error naming the file and slice when one does not fit.
void apply_startup_patches(ServerContext& ctx);

// The web pages (server/webui.cpp): / and /dashboard with their assets unless --no-webui,
// and GET /v1/step35/dashboard, the dashboard's data, always.
void add_webui_routes(httplib::Server& svr, ServerContext& ctx);

}  // namespace step35::server
