// `step35 serve`: the HTTP server in front of the continuous-batching engine. Routes,
// authentication, lifecycle (listen before the model loads so /health answers 503
// while loading; graceful shutdown on SIGTERM/SIGINT).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "engine/engine.h"

namespace step35::server {

struct ServerOptions {
  std::string model_path;
  std::string model_id;            // the name /v1/models reports; default: the file name
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;             // empty: no authentication
  double timeout_s = 600;          // per request (408 when exceeded)
  size_t max_body_bytes = 8 << 20; // 413 beyond
  int max_n = 8;                   // choices per request at most
  int http_threads = 0;            // 0: enough for every running and queued request
  // How long a connection may sit idle, before its first request or between keep-alive
  // requests, while holding an HTTP thread: it bounds how long a burst of idle connections
  // can keep a new request waiting for a thread.
  int keep_alive_s = 2;
  ExpertPolicy default_expert_policy = ExpertPolicy::Strict;  // what "auto" means
  float adaptive_mass = 0.9f;
  int32_t adaptive_min_k = 4;
  double shutdown_grace_s = 10;    // SIGTERM: how long in-flight requests may finish
  EngineOptions engine;
  // Called once the model is loaded, before the engine's first forward pass (e.g. to
  // install the expert-parallel executor of `--ep`).
  std::function<void(Model&)> on_model_loaded;
};

// Loads the model, serves until SIGTERM/SIGINT, returns the exit status (0 after a
// graceful shutdown). Throws for a port that cannot be bound or a model that fails to load.
int serve(const ServerOptions& options);

}  // namespace step35::server
