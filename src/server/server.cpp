#ifdef __GLIBC__
#include <malloc.h>
#endif
#include "server/server.h"

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "chat/step35_format.h"
#include "server/api_error.h"
#include "server/chat_plan.h"
#include "server/client_connection.h"
#include "server/endpoint.h"
#include "server/request_validation.h"
#include "server/server_context.h"
#include "server/streaming.h"
#include "step35_build_info.h"
#include "tensor/dtype.h"
#include "tensor/kernels.h"

namespace step35::server {

using nlohmann::json;

namespace {

json model_card(const ServerContext& ctx) {
  return {{"id", ctx.options.model_id},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "step35"},
          {"context_length", ctx.engine ? ctx.engine->options().n_ctx : 0},
          // As llama-server lists them: "multimodal" with a vision tower (--mmproj).
          {"capabilities", ctx.mmproj ? json::array({"completion", "multimodal"}) : json::array({"completion"})}};
}

// GET /props (llama-server's): the model, the context, the defaults a request gets.
json props(const ServerContext& ctx) {
  const EngineOptions& eo = ctx.engine->options();
  const ServerOptions& o = ctx.options;
  return {{"model", o.model_id},
          {"model_path", o.model_path},
          {"n_ctx", eo.n_ctx},
          {"n_ctx_train", ctx.model->hparams().n_ctx_train},
          {"total_slots", eo.n_parallel},
          {"default_generation_settings",
           {{"n_ctx", eo.n_ctx},
            {"params",
             {{"temperature", o.sampling.temperature},
              {"top_p", o.sampling.top_p},
              {"top_k", o.sampling.top_k},
              {"min_p", o.sampling.min_p},
              {"repeat_penalty", o.sampling.repeat_penalty},
              {"repeat_last_n", o.sampling.repeat_last_n},
              {"presence_penalty", o.sampling.presence_penalty},
              {"frequency_penalty", o.sampling.frequency_penalty},
              {"max_tokens", -1},
              {"reasoning_budget", o.reasoning.budget},
              {"reasoning_effort_budgets",
               {{"low", o.reasoning.low}, {"medium", o.reasoning.medium}, {"high", o.reasoning.high}}},
              {"timeout_s", o.timeout_s}}}}},
          {"chat_template", ctx.chat_template->source_text()},
          {"chat_format", ctx.chat_template->format() == ChatFormat::STEP35 ? "step35" : "chatml"},
          {"mtp", eo.mtp_adaptive && eo.mtp > 0 ? json("auto") : json(eo.mtp)},
          {"modalities", {{"vision", ctx.mmproj != nullptr}, {"audio", false}}},
          // The kernel level this CPU runs (tensor/kernels.h: Isa) and its vector features.
          {"kernels", {{"level", kernels::isa_name(kernels::active_isa())}, {"cpu", kernels::cpu_summary()}}},
          {"build_info", STEP35_BUILD_INFO}};
}

// /health, /metrics, /v1/models, /props, /version.
void add_info_routes(httplib::Server& svr, ServerContext& ctx) {
  svr.Get("/health", get_endpoint(ctx, {"/health", false, false}, [&ctx](HttpExchange& ex, const std::string&) {
            const std::string error = ctx.load_error();
            if (!error.empty()) {
              set_json(ex.res, {{"status", "error"}, {"error", error}}, 500);
            } else if (!ctx.ready) {
              ex.res.set_header("Retry-After", "5");
              set_json(ex.res, {{"status", "loading"}}, 503);
            } else if (ctx.draining) {
              set_json(ex.res, {{"status", "shutting_down"}}, 503);
            } else {
              set_json(ex.res, {{"status", "ok"}});
            }
          }));
  svr.Get("/metrics", get_endpoint(ctx, {"/metrics", false, true}, [&ctx](HttpExchange& ex, const std::string&) {
            const EngineStats s = ctx.ready ? ctx.engine->stats() : EngineStats{};
            ex.res.set_content(ctx.metrics.render(s, ctx.ready) + (ctx.ready ? hotswap_metrics(ctx) + model_memory_metrics(*ctx.model) + heap_metrics() : ""),
                               "text/plain; version=0.0.4");
          }));
  auto models = [&ctx](HttpExchange& ex, const std::string&) {
    set_json(ex.res, {{"object", "list"}, {"data", json::array({model_card(ctx)})}});
  };
  svr.Get("/v1/models", get_endpoint(ctx, {"/v1/models"}, models));
  svr.Get(R"(/v1/models/(.+))", get_endpoint(ctx, {"/v1/models/{id}"}, [&ctx](HttpExchange& ex, const std::string&) {
            if (ex.req.matches[1] != ctx.options.model_id)
              throw ApiError(404, "no model '" + std::string(ex.req.matches[1]) + "'", "model");
            set_json(ex.res, model_card(ctx));
          }));
  svr.Get("/props", get_endpoint(ctx, {"/props"}, [&ctx](HttpExchange& ex, const std::string&) {
            set_json(ex.res, props(ctx));
          }));
  // vLLM's GET /version; like /health it answers while loading and without a key (it
  // tells nothing about the model).
  svr.Get("/version", get_endpoint(ctx, {"/version", false, false}, [](HttpExchange& ex, const std::string&) {
            set_json(ex.res, {{"version", STEP35_VERSION}, {"commit", STEP35_COMMIT}, {"build_info", STEP35_BUILD_INFO}});
          }));
}

// The generation endpoints, the stored responses, /tokenize and /detokenize.
void add_model_routes(httplib::Server& svr, ServerContext& ctx) {
  svr.Post("/v1/chat/completions",
           chat_endpoint(ctx, {"/v1/chat/completions"}, [&ctx](HttpExchange& ex, const json& body) {
             handle_chat(ctx, body, nullptr, ex);
           }));
  svr.Post("/v1/completions", post_endpoint(ctx, {"/v1/completions"}, [&ctx](HttpExchange& ex, const std::string& body) {
             handle_completions(ctx, parse_body(body), ex);
           }));
  svr.Post("/v1/step35/execute",
           chat_endpoint(ctx, {"/v1/step35/execute"}, [&ctx](HttpExchange& ex, const json& body) {
             handle_execute(ctx, body, ex);
           }));
  svr.Post("/v1/messages", chat_endpoint(ctx, {"/v1/messages"}, [&ctx](HttpExchange& ex, const json& body) {
             handle_messages(ctx, body, ex);
           }));
  svr.Post("/v1/messages/count_tokens",
           chat_endpoint(ctx, {"/v1/messages/count_tokens"}, [&ctx](HttpExchange& ex, const json& body) {
             handle_count_tokens(ctx, body, ex);
           }));
  svr.Post("/v1/responses", chat_endpoint(ctx, {"/v1/responses"}, [&ctx](HttpExchange& ex, const json& body) {
             handle_responses(ctx, body, ex);
           }));
  svr.Get(R"(/v1/responses/([^/]+))", get_endpoint(ctx, {"/v1/responses/{id}"}, [&ctx](HttpExchange& ex, const std::string&) {
            const std::string id = ex.req.matches[1];
            auto r = ctx.responses.response(id);
            if (!r) throw ApiError(404, "no stored response '" + id + "'", "response_id");
            set_json(ex.res, *r);
          }));
  svr.Delete(R"(/v1/responses/([^/]+))",
             get_endpoint(ctx, {"/v1/responses/{id}"}, [&ctx](HttpExchange& ex, const std::string&) {
               const std::string id = ex.req.matches[1];
               if (!ctx.responses.erase(id)) throw ApiError(404, "no stored response '" + id + "'", "response_id");
               set_json(ex.res, {{"id", id}, {"object", "response"}, {"deleted", true}});
             }));
  // llama-server's endpoint: the prompt a chat completion's body renders to.
  svr.Post("/apply-template", chat_endpoint(ctx, {"/apply-template"}, [&ctx](HttpExchange& ex, const json& body) {
             handle_apply_template(ctx, body, ex);
           }));
  svr.Post("/tokenize", post_endpoint(ctx, {"/tokenize"}, [&ctx](HttpExchange& ex, const std::string& body) {
             set_json(ex.res, tokenize_response(ctx, parse_body(body)));
           }));
  svr.Post("/detokenize", post_endpoint(ctx, {"/detokenize"}, [&ctx](HttpExchange& ex, const std::string& body) {
             set_json(ex.res, detokenize_response(ctx, parse_body(body)));
           }));
}

// CORS preflights and the JSON shape of the errors httplib answers itself.
void add_cors_and_errors(httplib::Server& svr, ServerContext& ctx) {
  if (!ctx.options.cors_origins.empty()) {
    // Preflight: no key needed (browsers send none), the methods and headers the API uses.
    svr.Options(R"(.*)", [&ctx](const httplib::Request& req, httplib::Response& res) {
      add_cors(ctx, req, res);
      res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Headers",
                     asked.empty() ? "Authorization, Content-Type, x-api-key, anthropic-version" : asked);
      res.set_header("Access-Control-Max-Age", "600");
      res.status = 204;
    });
  }
  // 404s, 405s and other statuses httplib answers itself get the JSON error shape.
  svr.set_error_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    add_cors(ctx, req, res);
    if (!res.body.empty()) return;
    std::string msg = res.status == 404   ? "no endpoint " + req.method + " " + req.path
                      : res.status == 413 ? "the request body is too large"
                      : res.status == 405 ? "method not allowed"
                                          : "the request could not be processed";
    set_json(res, ApiError(res.status, msg).body(), res.status);
  });
}

// Expert hot-swap (server/hotswap.cpp): swap a patch in, take it back, list the active ones.
void add_hotswap_routes(httplib::Server& svr, ServerContext& ctx) {
  svr.Post("/v1/step35/hotswap",
           post_endpoint(ctx, {"/v1/step35/hotswap"}, [&ctx](HttpExchange& ex, const std::string& body) {
             handle_hotswap(ctx, body, ex);
           }));
  svr.Post("/v1/step35/hotswap/revert",
           post_endpoint(ctx, {"/v1/step35/hotswap/revert"}, [&ctx](HttpExchange& ex, const std::string& body) {
             handle_hotswap_revert(ctx, body, ex);
           }));
  svr.Get("/v1/step35/hotswap", get_endpoint(ctx, {"/v1/step35/hotswap"}, [&ctx](HttpExchange& ex, const std::string&) {
            handle_hotswap_list(ctx, ex);
          }));
}

void add_routes(httplib::Server& svr, ServerContext& ctx) {
  add_info_routes(svr, ctx);
  add_model_routes(svr, ctx);
  add_hotswap_routes(svr, ctx);
  add_webui_routes(svr, ctx);
  add_cors_and_errors(svr, ctx);
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1 << 20));
  return buf;
}

// --kv-mem against what the engine can use: at least one sequence of the context, at most
// what the pool can index.
void check_kv_memory(const Model& model, const EngineOptions& eo) {
  if (eo.kv_bytes <= 0) return;
  const KvBudget b = kv_budget(model, eo);
  if (eo.kv_bytes < b.per_sequence_bytes)
    throw std::runtime_error("--kv-mem " + std::to_string(eo.kv_bytes >> 20) + " MiB is less than one sequence of " +
                             std::to_string(eo.n_ctx) + " tokens needs (" + mib(double(b.per_sequence_bytes)) +
                             "): raise --kv-mem or lower -c");
  if (eo.kv_bytes > b.max_pool_bytes)
    throw std::runtime_error("--kv-mem " + std::to_string(eo.kv_bytes >> 20) +
                             " MiB is more than the KV pool can index for this model (" +
                             mib(double(b.max_pool_bytes)) + " at most)");
}

// What was loaded and how it will run, for the log.
void log_startup_summary(ServerContext& ctx) {
  const Model& m = *ctx.model;
  const HParams& hp = m.hparams();
  std::map<std::string, int> types;
  uint64_t n_params = 0;
  for (const auto& t : m.file().tensors()) {
    const DTypeInfo* info = dtype_info(t.type);
    ++types[info ? info->name : "type " + std::to_string(t.type)];
    n_params += uint64_t(t.n_elements());
  }
  std::string type_text;
  json type_json = json::object();
  for (const auto& [name, count] : types) {
    type_text += (type_text.empty() ? "" : ", ") + name + " x" + std::to_string(count);
    type_json[name] = count;
  }
  int n_moe = 0;
  for (int il = 0; il < hp.n_layer; ++il) n_moe += hp.layers[size_t(il)].is_moe;
  const std::string name = m.file().opt_str("general.name").value_or(ctx.options.model_id);
  std::string repack = "none";
  if (m.repacked_bytes() > 0 || m.lazy_repack_bytes() > 0)
    repack = mib(double(m.repacked_bytes())) + " at load" +
             (m.lazy_repack_bytes() > 0 ? ", experts on first use (" + mib(double(m.lazy_repack_bytes())) + ")" : "");
  char params_text[32];
  if (n_params >= 1000000000)
    std::snprintf(params_text, sizeof params_text, "%.1fB", double(n_params) / 1e9);
  else
    std::snprintf(params_text, sizeof params_text, "%.2fM", double(n_params) / 1e6);
  ctx.log.event("model",
                "model '" + name + "' (" + ctx.options.model_path + "): " + std::to_string(hp.n_layer) + " layers (" +
                    std::to_string(n_moe) + " MoE, " + std::to_string(hp.n_expert) + " experts), " + params_text +
                    " parameters, " + mib(double(m.weight_bytes())) + " mapped; tensor types: " + type_text +
                    "; repacked: " + repack,
                {{"name", name},
                 {"path", ctx.options.model_path},
                 {"layers", hp.n_layer},
                 {"moe_layers", n_moe},
                 {"experts", hp.n_expert},
                 {"parameters", n_params},
                 {"weight_bytes", m.weight_bytes()},
                 {"tensor_types", type_json},
                 {"repacked_bytes", m.repacked_bytes()},
                 {"lazy_repack_bytes", m.lazy_repack_bytes()}});
  const EngineOptions& eo = ctx.engine->options();
  const EngineStats st = ctx.engine->stats();
  const std::string mtp = !m.has_mtp()                ? "none in the model"
                          : eo.mtp == 0                ? std::to_string(m.n_mtp_loaded()) + " blocks, off (--mtp 0)"
                          : eo.mtp_adaptive            ? std::to_string(m.n_mtp_loaded()) + " blocks, auto (up to " +
                                                             std::to_string(eo.mtp) + " drafts)"
                                                       : std::to_string(m.n_mtp_loaded()) + " blocks, " +
                                                             std::to_string(eo.mtp) + " drafts per step";
  const std::string mtp_from = m.mtp_sidecar_path().empty() ? "" : " (from the sidecar " + m.mtp_sidecar_path() + ")";
  ctx.log.event("engine",
                "KV pool " + mib(double(st.kv_pool_bytes)) + " (K " + dtype_name(eo.kv_types.k) + ", V " +
                    dtype_name(eo.kv_types.v) + ") in " + std::to_string(st.kv_blocks_total) + " blocks; context " + std::to_string(eo.n_ctx) + " tokens per sequence (model: " +
                    std::to_string(hp.n_ctx_train) + "), " + std::to_string(eo.n_parallel) + " in parallel, batch " +
                    std::to_string(eo.n_batch) + ", " + std::to_string(eo.n_threads) + " threads; MTP: " + mtp + mtp_from +
                    "; chat format: " + (ctx.chat_template->format() == ChatFormat::STEP35 ? "step35" : "chatml"),
                {{"kv_pool_bytes", st.kv_pool_bytes},
                 {"kv_blocks", st.kv_blocks_total},
                 {"cache_type_k", dtype_name(eo.kv_types.k)},
                 {"cache_type_v", dtype_name(eo.kv_types.v)},
                 {"n_ctx", eo.n_ctx},
                 {"n_ctx_train", hp.n_ctx_train},
                 {"parallel", eo.n_parallel},
                 {"batch", eo.n_batch},
                 {"threads", eo.n_threads},
                 {"mtp", mtp},
                 {"mtp_sidecar", m.mtp_sidecar_path()}});
}

// SIGTERM / SIGINT, taken by a watcher thread with sigtimedwait (they are blocked in every
// thread). During the load nothing needs an orderly stop, so a signal ends the process at
// once; once serving, the first signal starts the graceful shutdown and a second one ends
// the process without waiting.
class StopSignals {
 public:
  StopSignals(ServerContext& ctx, sigset_t set) : ctx_(ctx), set_(set), thread_([this] { watch(); }) {}
  ~StopSignals() {
    running_ = false;
    thread_.join();
  }
  // Blocks until the first signal; returns it.
  int wait() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return signal_ != 0; });
    return signal_;
  }

 private:
  void watch() {
    const timespec tick{0, 100 * 1000 * 1000};
    while (running_) {
      const int sig = sigtimedwait(&set_, nullptr, &tick);
      if (sig <= 0) continue;
      const char* name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
      if (!ctx_.ready) {
        ctx_.log.event("stopped", std::string(name) + " during the model load: exiting", {{"signal", name}});
        std::_Exit(0);
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (signal_ != 0) {
        ctx_.log.event("stopped", std::string("second ") + name + ": exiting without waiting", {{"signal", name}});
        std::_Exit(1);
      }
      signal_ = sig;
      cv_.notify_all();
    }
  }

  ServerContext& ctx_;
  sigset_t set_;
  std::atomic<bool> running_{true};
  std::mutex mu_;
  std::condition_variable cv_;
  int signal_ = 0;
  std::thread thread_;  // last: started once the rest is set up
};

// Runs the listener on its own thread and stops it on every path out.
class Listener {
 public:
  explicit Listener(httplib::Server& svr) : svr_(svr), thread_([this] {
    svr_.listen_after_bind();
    ended_ = true;
  }) {}
  ~Listener() {
    // stop() only works once the accept loop runs: wait for it to start (or to have failed).
    while (!svr_.is_running() && !ended_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    svr_.stop();
    thread_.join();
  }

 private:
  httplib::Server& svr_;
  std::atomic<bool> ended_{false};
  std::thread thread_;
};

// The stack of every thread the server starts (the HTTP threads among them). glibc's default
// follows the stack rlimit of the shell that started the process (`ulimit -s`, a
// container's setting), so without this the depth a request may reach before it overflows
// would depend on the environment. Request bodies nest at most kMaxJsonTextNesting levels
// (request_validation.cpp), far inside this.
constexpr size_t kThreadStackBytes = size_t(8) << 20;

// Threads created after this call (std::thread included) get `bytes` of stack.
void give_new_threads_a_stack(size_t bytes) {
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) return;
  if (pthread_attr_setstacksize(&attr, bytes) == 0) pthread_setattr_default_np(&attr);
  pthread_attr_destroy(&attr);
}

// The HTTP settings: limits, timeouts, socket options, threads.
void configure_http(httplib::Server& svr, const ServerOptions& options) {
  svr.set_payload_max_length(options.max_body_bytes);
  svr.set_read_timeout(options.read_timeout_s, 0);
  svr.set_write_timeout(30, 0);
  svr.set_keep_alive_max_count(1000);
  svr.set_keep_alive_timeout(options.keep_alive_s);
  // httplib's default sets SO_REUSEPORT, with which a second server binds the same port and
  // the kernel splits the connections between the two. SO_REUSEADDR alone still allows a
  // restart while old connections linger in TIME_WAIT, but not a second listener.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // One HTTP thread per request that can be running or queued, plus a few for
  // health/metrics probes, so a full queue is answered with 503 rather than left hanging.
  const int threads = options.http_threads > 0
                          ? options.http_threads
                          : std::min(512, options.engine.n_parallel * std::max(1, options.max_n) +
                                              options.engine.max_queue + 8);
  svr.new_task_queue = [threads] {
    give_new_threads_a_stack(kThreadStackBytes);
    return new httplib::ThreadPool(size_t(threads));
  };
}

// The listening socket's accept queue to SOMAXCONN. The packaged cpp-httplib (0.11) listens
// with a backlog of 5, compiled into its library: a burst of new connections (agents
// opening several at once, a load test, a proxy's pool) overflows it whenever the accept
// thread is a moment late, and each dropped SYN costs that client a 1 s retransmit: 200
// connections opened one after another took 10-21 s. Linux lets listen() on a listening
// socket change its backlog; the socket is the one of this process accepting connections
// on `port`. Best effort: nothing changes when it cannot be found.
void widen_accept_queue(int port) {
  const int fd = find_own_socket([port](int fd) {
    int accepting = 0;
    socklen_t len = sizeof accepting;
    std::string host;
    int bound = -1;
    return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) == 0 && accepting &&
           socket_address(fd, false, host, bound) && bound == port;
  });
  if (fd >= 0) listen(fd, SOMAXCONN);
}

// Binds the port (0: any free one); returns it. Throws when it cannot.
int bind_port(httplib::Server& svr, const ServerOptions& options) {
  errno = 0;
  const int port = options.port == 0 ? svr.bind_to_any_port(options.host) : options.port;
  if (port <= 0 || (options.port != 0 && !svr.bind_to_port(options.host, options.port))) {
    const bool in_use = errno == EADDRINUSE;
    throw std::runtime_error("cannot listen on " + options.host + ":" + std::to_string(options.port) +
                             (in_use ? ": the address is already in use (another server?)"
                                     : " (in use, or not a local address)"));
  }
  widen_accept_queue(port);
  return port;
}

// The engine's options for the loaded model: -c 0 is the model's context, more than the
// model's is cut to it (and said so), --kv-mem is checked.
EngineOptions engine_options(ServerContext& ctx, const EngineOptions& asked) {
  EngineOptions eo = asked;
  const int32_t n_ctx_train = ctx.model->hparams().n_ctx_train;
  if (eo.n_ctx == 0) eo.n_ctx = n_ctx_train;
  if (eo.n_ctx < 0) eo.n_ctx = std::min(EngineOptions{}.n_ctx, n_ctx_train);
  if (eo.n_ctx > n_ctx_train) {
    ctx.log.event("context", "context " + std::to_string(eo.n_ctx) + " (-c) is more than the model's " +
                                 std::to_string(n_ctx_train) + ": using " + std::to_string(n_ctx_train),
                  {{"asked", eo.n_ctx}, {"used", n_ctx_train}});
    eo.n_ctx = n_ctx_train;
  }
  check_kv_memory(*ctx.model, eo);
  // Not ready until one forward pass has run: otherwise the first request's TTFT
  // includes faulting in the weights.
  eo.warm_up = true;
  return eo;
}

void release_free_heap() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

// The vision tower of --mmproj, checked against the text model: its projection width and
// the layout tokens its pictures are placed with.
void load_vision(ServerContext& ctx, const ServerOptions& options) {
  ctx.mmproj = vision::Step3vlEncoder::load(options.mmproj);
  const int32_t n_embd = ctx.model->hparams().n_embd;
  if (ctx.mmproj->projection_dim() != n_embd)
    throw std::runtime_error("--mmproj " + options.mmproj + ": the vision tower projects to " +
                             std::to_string(ctx.mmproj->projection_dim()) + " dimensions, the model's embedding has " +
                             std::to_string(n_embd) + " (an mmproj for another model?)");
  for (const char* t : {"<im_start>", "<im_end>", "<patch_start>", "<patch_end>", "<patch_newline>"})
    if (ctx.tokenizer().find_token(t) < 0)
      throw std::runtime_error("--mmproj " + options.mmproj + ": the model's vocabulary has no " + t +
                               " token, so pictures cannot be placed (not a Step-3.7 text model?)");
  ctx.vision_pool = std::make_unique<ThreadPool>(std::max(1, options.engine.n_threads));
  if (options.image_cache_bytes > 0) ctx.image_cache = std::make_unique<vision::EmbeddingCache>(options.image_cache_bytes);
  ctx.log.event("vision",
                "pictures through " + options.mmproj + " (step3vl: " + std::to_string(ctx.mmproj->n_layers()) +
                    " layers of width " + std::to_string(ctx.mmproj->width()) + ", " +
                    std::to_string(ctx.mmproj->n_params()) + " parameters)",
                {{"mmproj", options.mmproj},
                 {"vision_layers", ctx.mmproj->n_layers()},
                 {"vision_parameters", ctx.mmproj->n_params()}});
}

// The model, its chat template and the engine; a failure is kept for /health and thrown.
void load(ServerContext& ctx, const ServerOptions& options) {
  try {
    Model::LoadOptions lo;
    lo.mtp_model = options.mtp_model;
    lo.mem_budget = options.mem_budget;
    lo.mem_kv_positions = options.engine.kv_bytes > 0 ? 0 : int64_t(options.engine.n_ctx) * options.engine.n_parallel;
    lo.mem_kv_types = options.engine.kv_types;
    ctx.model = Model::load(options.model_path, lo);
    // Test seam (tests/test_server_lifecycle.cpp): a load that takes this long, so that a
    // test can signal a server that is still loading.
    if (const char* delay = std::getenv("STEP35_TEST_LOAD_DELAY_MS"))
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(delay)));
    if (!options.patches.empty()) apply_startup_patches(ctx);
    if (options.on_model_loaded) options.on_model_loaded(*ctx.model);
    if (!options.mmproj.empty()) load_vision(ctx, options);
    const Tokenizer& tok = ctx.model->tokenizer();
    ctx.chat_template = std::make_unique<ChatTemplate>(
        ChatTemplateSource::from_model(ctx.model->file(), tok, options.chat_template_file));
    ctx.think_end = step35_format::think_end_token(tok);
    EngineOptions eo = engine_options(ctx, options.engine);
    // Requests free what they allocated, but the C library keeps freed heap pages for reuse;
    // whenever the engine runs out of work they go back to the system, so an idle server's
    // memory is what it holds, not the high-water mark of the busiest minute (docs/reliability.md).
    eo.on_idle = release_free_heap;
    // Test seam (tests/node/webui.test.mjs): every forward pass takes at least this long, so
    // that a browser test can stop, or lose the connection to, an answer still streaming.
    if (const char* delay = std::getenv("STEP35_TEST_STEP_DELAY_MS")) {
      const auto pause = std::chrono::milliseconds(std::atoll(delay));
      eo.on_step = [inner = eo.on_step, pause](const StepTrace& t) {
        if (inner) inner(t);
        std::this_thread::sleep_for(pause);
      };
    }
    ctx.engine = make_engine(*ctx.model, eo);
  } catch (const std::exception& e) {
    ctx.set_load_error(e.what());
    throw;
  }
}

// Refuses new requests, lets the running ones finish for a while, then cancels the rest
// (each gets its final event, so every handler returns).
void drain(ServerContext& ctx, double grace_s) {
  ctx.draining = true;
  const auto grace_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(grace_s * 1000));
  while (ctx.in_flight > 0 && std::chrono::steady_clock::now() < grace_end)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ctx.engine->shutdown();
}

}  // namespace

int serve(const ServerOptions& options) {
  // SIGTERM / SIGINT are taken by StopSignals, never by a handler: blocked here, before any
  // thread starts, so every thread inherits the mask. Writes to a client that left must
  // fail with EPIPE, not kill the process.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ServerContext ctx;
  ctx.options = options;
  ctx.log.configure(options.log_format, options.access_log);
  if (ctx.options.model_id.empty()) {
    const std::string& p = options.model_path;
    ctx.options.model_id = p.substr(p.find_last_of('/') == std::string::npos ? 0 : p.find_last_of('/') + 1);
  }
  StopSignals signals(ctx, stop_signals);
  httplib::Server svr;
  configure_http(svr, options);
  add_routes(svr, ctx);
  const int port = bind_port(svr, options);
  {
    Listener listener(svr);  // stops listening on every way out of this block
    ctx.log.event("listening",
                  std::string(STEP35_BUILD_INFO) + " listening on http://" + options.host + ":" +
                      std::to_string(port) + " (loading " + options.model_path + ")",
                  {{"host", options.host},
                   {"port", port},
                   {"model_path", options.model_path},
                   {"version", STEP35_VERSION},
                   {"commit", STEP35_COMMIT}});
    load(ctx, options);  // a failure: the caller prints the reason
    log_startup_summary(ctx);
    ctx.ready = true;
    ctx.log.event("ready", "ready: http://" + options.host + ":" + std::to_string(port) + " serves '" +
                               ctx.options.model_id + "'",
                  {{"model", ctx.options.model_id}, {"port", port}});
    const int sig = signals.wait();
    const char* name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    ctx.log.event("stopping", std::string(name) + " received, shutting down", {{"signal", name}});
    drain(ctx, options.shutdown_grace_s);
  }
  ctx.log.event("stopped", "stopped");
  return 0;
}

}  // namespace step35::server
