// `step35 serve`: the HTTP server in front of the continuous-batching engine. Routes,
// authentication, lifecycle (listen before the model loads so /health answers 503
// while loading; graceful shutdown on SIGTERM/SIGINT).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "server/image_fetch.h"

namespace step35::server {

// The sampling a request gets for the fields it leaves out (`serve --temp` etc., the flags
// `run` has): OpenAI's defaults (temperature 1, top_p 1, no penalties), top-k and min-p off.
inline SamplingParams openai_sampling_defaults() {
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_p = 1.0f;
  sp.top_k = 0;
  sp.min_p = 0.0f;
  return sp;
}

// Reasoning budgets in tokens (-1: unbounded, 0: no reasoning).
struct ReasoningDefaults {
  int32_t budget = -1;       // requests that ask for nothing
  int32_t low = 512;         // reasoning_effort "low"
  int32_t medium = 2048;     // "medium"
  int32_t high = -1;         // "high" (and "xhigh")
};

enum class LogFormat : uint8_t { Text, Json };

struct ServerOptions {
  std::string model_path;
  std::string mtp_model;  // Model::LoadOptions::mtp_model
  uint64_t mem_budget = 0;  // --mem-budget: Model::LoadOptions::mem_budget (0: none)
  std::string mmproj;     // the vision tower, a step3vl mmproj GGUF ("": text only)
  size_t image_cache_bytes = size_t(256) << 20;  // embeddings of recent pictures kept (0: none)
  ImageFetchOptions image_fetch;  // pictures by http(s) URL (--allow-image-urls; off by default)
  std::string model_id;            // the name /v1/models reports; default: the file name
  std::string chat_template_file;  // a Jinja chat template replacing the file's ("": the file's)
  std::string host = "127.0.0.1";
  int port = 8080;
  std::vector<std::string> api_keys;  // empty: no authentication; else any of them
  std::vector<std::string> cors_origins;  // origins answered with CORS headers ("*": any)
  bool webui = true;               // the chat page at / and the dashboard at /dashboard (--no-webui: off)
  LogFormat log_format = LogFormat::Text;
  bool access_log = true;          // one line per request
  SamplingParams sampling = openai_sampling_defaults();  // seed unused (a request's own, or random)
  ReasoningDefaults reasoning;
  double timeout_s = 600;          // per request (408 when exceeded)
  size_t max_body_bytes = 8 << 20; // 413 beyond
  int max_n = 8;                   // choices per request at most
  int http_threads = 0;            // 0: enough for every running and queued request
  // How long a connection may sit idle, before its first request or between keep-alive
  // requests, while holding an HTTP thread: it bounds how long a burst of idle connections
  // can keep a new request waiting for a thread.
  int keep_alive_s = 2;
  // How long a client may go silent while sending its request line, headers or body before
  // the connection is dropped: a stalled or slow-loris client frees its HTTP thread then.
  int read_timeout_s = 30;
  ExpertPolicy default_expert_policy = ExpertPolicy::Strict;  // what "auto" means
  float adaptive_mass = kDefaultAdaptiveMass;
  int32_t adaptive_min_k = kDefaultAdaptiveMinK;
  double shutdown_grace_s = 10;    // SIGTERM: how long in-flight requests may finish
  // engine.n_ctx: the context per sequence; 0 = the model's, < 0 = EngineOptions' default
  // (or the model's when smaller). More than the model's is cut to the model's.
  EngineOptions engine;
  // Patch files from `step35 finetune` (--patch) installed once the model is loaded, in
  // order (later ones win where they overlap); hot-swaps stack on top of them.
  std::vector<std::string> patches;
  // Called once the model is loaded, before the engine's first forward pass (e.g. to
  // install the expert-parallel executor of `--ep`).
  std::function<void(Model&)> on_model_loaded;
};

// Listens, loads the model, serves until SIGTERM/SIGINT; returns the exit status (0 after
// a graceful shutdown, or after a signal during the load, which ends the process at once).
// Throws for a port that cannot be bound (already in use included) or a model that fails
// to load, after releasing the port.
int serve(const ServerOptions& options);

}  // namespace step35::server
