#include "server/server.h"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "server/api_error.h"
#include "server/chat_plan.h"
#include "server/request_validation.h"
#include "server/server_context.h"

namespace step35::server {

using nlohmann::json;

void set_json(httplib::Response& res, const json& body, int status) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void set_event_stream(ServerContext& ctx, httplib::Response& res, std::function<void(httplib::DataSink&)> produce) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // A stream still being written counts as in flight (graceful shutdown waits for it).
  ++ctx.in_flight;
  auto produce_ptr = std::make_shared<std::function<void(httplib::DataSink&)>>(std::move(produce));
  res.set_chunked_content_provider(
      "text/event-stream",
      [produce_ptr](size_t, httplib::DataSink& sink) {
        (*produce_ptr)(sink);
        return true;
      },
      [&ctx, produce_ptr](bool) {
        produce_ptr->operator=(nullptr);  // drops the generation run (cancelling what is left)
        --ctx.in_flight;
      });
}

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof kChars - 1)];
  return id;
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace {

// Compares without an early exit, so the time taken does not reveal the key's prefix.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned diff = unsigned(a.size() ^ b.size());
  for (size_t i = 0; i < a.size(); ++i) diff |= unsigned(uint8_t(a[i]) ^ uint8_t(i < b.size() ? b[i] : 0));
  return diff == 0;
}

bool authorised(const ServerContext& ctx, const httplib::Request& req) {
  if (ctx.options.api_key.empty()) return true;
  const std::string auth = req.get_header_value("Authorization");
  static const std::string kBearer = "Bearer ";
  if (auth.compare(0, kBearer.size(), kBearer) == 0 && same_secret(auth.substr(kBearer.size()), ctx.options.api_key))
    return true;
  return req.has_header("x-api-key") && same_secret(req.get_header_value("x-api-key"), ctx.options.api_key);
}

// OpenAI's error shape, or Anthropic's ({"type":"error","error":{"type","message"}}) on
// the Anthropic endpoint.
void send_error(httplib::Response& res, const ApiError& e, bool anthropic) {
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  if (e.status() == 401) res.set_header("WWW-Authenticate", "Bearer");
  if (anthropic) {
    const std::string type = e.status() == 503 ? "overloaded_error" : e.status() >= 500 ? "api_error" : e.type();
    set_json(res, {{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}}, e.status());
  } else {
    set_json(res, e.body(), e.status());
  }
}

using Body = std::function<void(const httplib::Request&, httplib::Response&)>;

// Every endpoint goes through here: authentication, readiness, error mapping, metrics.
httplib::Server::Handler endpoint(ServerContext& ctx, const std::string& name, bool needs_model, bool needs_auth,
                                  Body body) {
  const bool anthropic = name == "/v1/messages";
  return [&ctx, name, needs_model, needs_auth, body, anthropic](const httplib::Request& req, httplib::Response& res) {
    ++ctx.in_flight;
    try {
      if (needs_auth && !authorised(ctx, req))
        throw ApiError(401, "a valid API key is required (Authorization: Bearer KEY or x-api-key: KEY)");
      if (needs_model && !ctx.ready) {
        ApiError e(503, "the model is loading");
        e.retry_after_s = 5;
        throw e;
      }
      if (needs_model && ctx.draining) {
        ApiError e(503, "the server is shutting down");
        e.retry_after_s = 5;
        throw e;
      }
      body(req, res);
    } catch (const ApiError& e) {
      send_error(res, e, anthropic);
    } catch (const QueueFullError& e) {
      ApiError a(503, e.what());
      a.retry_after_s = 1;
      send_error(res, a, anthropic);
    } catch (const RequestError& e) {
      send_error(res, ApiError(400, e.what()), anthropic);
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, std::string("internal error: ") + e.what()), anthropic);
    }
    ctx.metrics.count_request(name, res.status);
    --ctx.in_flight;
  };
}

json model_card(const ServerContext& ctx) {
  return {{"id", ctx.options.model_id},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "step35"},
          {"context_length", ctx.engine ? ctx.engine->options().n_ctx : 0}};
}

void add_routes(httplib::Server& svr, ServerContext& ctx) {
  svr.Get("/health", endpoint(ctx, "/health", false, false, [&ctx](const httplib::Request&, httplib::Response& res) {
            if (!ctx.ready) {
              res.set_header("Retry-After", "5");
              set_json(res, {{"status", "loading"}}, 503);
            } else if (ctx.draining) {
              set_json(res, {{"status", "shutting_down"}}, 503);
            } else {
              set_json(res, {{"status", "ok"}});
            }
          }));
  svr.Get("/metrics", endpoint(ctx, "/metrics", false, true, [&ctx](const httplib::Request&, httplib::Response& res) {
            const EngineStats s = ctx.ready ? ctx.engine->stats() : EngineStats{};
            res.set_content(ctx.metrics.render(s, ctx.ready) + (ctx.ready ? hotswap_metrics(ctx) : ""),
                            "text/plain; version=0.0.4");
          }));
  auto models = [&ctx](const httplib::Request&, httplib::Response& res) {
    set_json(res, {{"object", "list"}, {"data", json::array({model_card(ctx)})}});
  };
  svr.Get("/v1/models", endpoint(ctx, "/v1/models", true, true, models));
  svr.Get(R"(/v1/models/(.+))", endpoint(ctx, "/v1/models/{id}", true, true,
                                         [&ctx](const httplib::Request& req, httplib::Response& res) {
                                           if (req.matches[1] != ctx.options.model_id)
                                             throw ApiError(404, "no model '" + std::string(req.matches[1]) + "'", "model");
                                           set_json(res, model_card(ctx));
                                         }));
  svr.Post("/v1/chat/completions",
           endpoint(ctx, "/v1/chat/completions", true, true, [&ctx](const httplib::Request& req, httplib::Response& res) {
             handle_chat(ctx, parse_body(req.body), nullptr, res);
           }));
  svr.Post("/v1/completions",
           endpoint(ctx, "/v1/completions", true, true, [&ctx](const httplib::Request& req, httplib::Response& res) {
             handle_completions(ctx, parse_body(req.body), res);
           }));
  svr.Post("/v1/step35/execute",
           endpoint(ctx, "/v1/step35/execute", true, true, [&ctx](const httplib::Request& req, httplib::Response& res) {
             handle_execute(ctx, parse_body(req.body), res);
           }));
  svr.Post("/v1/messages",
           endpoint(ctx, "/v1/messages", true, true, [&ctx](const httplib::Request& req, httplib::Response& res) {
             handle_messages(ctx, parse_body(req.body), res);
           }));
  svr.Post("/tokenize", endpoint(ctx, "/tokenize", true, true, [&ctx](const httplib::Request& req, httplib::Response& res) {
             set_json(res, tokenize_response(ctx, parse_body(req.body)));
           }));
  svr.Post("/detokenize", endpoint(ctx, "/detokenize", true, true, [&ctx](const httplib::Request& req, httplib::Response& res) {
             set_json(res, detokenize_response(ctx, parse_body(req.body)));
           }));
  svr.Post("/v1/step35/hotswap", endpoint(ctx, "/v1/step35/hotswap", true, true,
                                          [&ctx](const httplib::Request& req, httplib::Response& res) {
                                            handle_hotswap(ctx, req, res);
                                          }));
  svr.Post("/v1/step35/hotswap/revert", endpoint(ctx, "/v1/step35/hotswap/revert", true, true,
                                                 [&ctx](const httplib::Request& req, httplib::Response& res) {
                                                   handle_hotswap_revert(ctx, req, res);
                                                 }));
  svr.Get("/v1/step35/hotswap", endpoint(ctx, "/v1/step35/hotswap", true, true,
                                         [&ctx](const httplib::Request& req, httplib::Response& res) {
                                           handle_hotswap_list(ctx, req, res);
                                         }));
  // 404s, 413 (body limit) and other statuses httplib answers itself get the JSON error shape.
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg = res.status == 404   ? "no endpoint " + req.method + " " + req.path
                      : res.status == 413 ? "the request body is too large"
                      : res.status == 405 ? "method not allowed"
                                          : "the request could not be processed";
    set_json(res, ApiError(res.status, msg).body(), res.status);
  });
}

}  // namespace

int serve(const ServerOptions& options) {
  // SIGTERM / SIGINT are taken by sigwait() below, never by a handler: blocked here, before
  // any thread starts, so every thread inherits the mask. Writes to a client that left
  // must fail with EPIPE, not kill the process.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ServerContext ctx;
  ctx.options = options;
  if (ctx.options.model_id.empty()) {
    const std::string& p = options.model_path;
    ctx.options.model_id = p.substr(p.find_last_of('/') == std::string::npos ? 0 : p.find_last_of('/') + 1);
  }
  httplib::Server svr;
  svr.set_payload_max_length(options.max_body_bytes);
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);
  svr.set_keep_alive_max_count(1000);
  svr.set_keep_alive_timeout(options.keep_alive_s);
  // One HTTP thread per request that can be running or queued, plus a few for
  // health/metrics probes, so a full queue is answered with 503 rather than left hanging.
  const int threads = options.http_threads > 0
                          ? options.http_threads
                          : std::min(512, options.engine.n_parallel * std::max(1, options.max_n) +
                                              options.engine.max_queue + 8);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  add_routes(svr, ctx);
  // Port 0: any free port (printed below).
  const int port = options.port == 0 ? svr.bind_to_any_port(options.host) : options.port;
  if (port <= 0 || (options.port != 0 && !svr.bind_to_port(options.host, options.port)))
    throw std::runtime_error("cannot listen on " + options.host + ":" + std::to_string(options.port) +
                             " (in use, or not a local address)");
  std::thread http([&svr] { svr.listen_after_bind(); });
  std::fprintf(stderr, "step35 serve: listening on http://%s:%d (loading %s)\n", options.host.c_str(), port,
               options.model_path.c_str());
  try {
    Model::LoadOptions lo;
    ctx.model = Model::load(options.model_path, lo);
    if (options.on_model_loaded) options.on_model_loaded(*ctx.model);
    const Tokenizer& tok = ctx.model->tokenizer();
    ctx.chat_template = std::make_unique<ChatTemplate>(
        ctx.model->file().opt_str("tokenizer.chat_template").value_or(""),
        tok.bos() >= 0 ? tok.token_to_piece(tok.bos()) : "");
    ctx.think_end = tok.find_token("</think>");
    EngineOptions eo = options.engine;
    if (eo.n_ctx <= 0) eo.n_ctx = std::min(4096, ctx.model->hparams().n_ctx_train);
    // Not ready until one forward pass has run: otherwise the first request's TTFT
    // includes faulting in the weights.
    eo.warm_up = true;
    ctx.engine = make_engine(*ctx.model, eo);
  } catch (...) {
    svr.stop();
    http.join();
    throw;
  }
  ctx.ready = true;
  std::fprintf(stderr, "step35 serve: ready (model '%s', context %d, %d parallel, %d threads)\n",
               ctx.options.model_id.c_str(), ctx.engine->options().n_ctx, ctx.engine->options().n_parallel,
               ctx.engine->options().n_threads);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "step35 serve: %s received, shutting down\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  // Refuse new requests, let the running ones finish for a while, then cancel the rest
  // (each gets its final event, so every handler returns) and stop listening.
  ctx.draining = true;
  const auto grace_end = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(int64_t(options.shutdown_grace_s * 1000));
  while (ctx.in_flight > 0 && std::chrono::steady_clock::now() < grace_end)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ctx.engine->shutdown();
  svr.stop();
  http.join();
  std::fprintf(stderr, "step35 serve: stopped\n");
  return 0;
}

}  // namespace step35::server
