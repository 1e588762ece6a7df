// step35 serve: the OpenAI-compatible HTTP server (src/server) over the continuous-batching engine.
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "ep_options.h"
#include "server/server.h"

namespace step35::cli {

// --log-steps: what each pass carried and what it cost, to see how a load's time splits
// between prompt and decode work (docs/performance.md uses it).
static void log_step(const StepTrace& t) {
  int32_t decode_tokens = 0, decode_seqs = 0, prompt_tokens = 0, prompt_chunks = 0;
  for (const StepTrace::Chunk& c : t.chunks) {
    if (c.prefill) {
      prompt_tokens += c.n_tokens;
      ++prompt_chunks;
    } else {
      decode_tokens += c.n_tokens;
      ++decode_seqs;
    }
  }
  std::fprintf(stderr, "step35 serve: step %llu: decode %d tokens of %d sequences, prompt %d tokens in %d chunks, "
               "forward %.2f ms\n", static_cast<unsigned long long>(t.step), decode_tokens, decode_seqs,
               prompt_tokens, prompt_chunks, t.forward_ms);
}

// Comma-separated items, spaces around them dropped, empty ones skipped.
static std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.erase(item.begin());
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
    if (!item.empty()) out.push_back(item);
    i = j + 1;
  }
  return out;
}

// The API keys: --api-key (comma-separated), then the lines of --api-key-file (blank lines
// and # comments skipped); $STEP35_API_KEY when neither gives one.
static std::vector<std::string> api_keys(const std::string& flag, const std::string& file) {
  std::vector<std::string> keys = split_list(flag);
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) throw UsageError("--api-key-file " + file + ": cannot read it");
    size_t from_file = 0;
    for (std::string line; std::getline(in, line);) {
      while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
      size_t b = 0;
      while (b < line.size() && std::isspace(static_cast<unsigned char>(line[b]))) ++b;
      line.erase(0, b);
      if (line.empty() || line[0] == '#') continue;
      keys.push_back(line);
      ++from_file;
    }
    if (from_file == 0) throw UsageError("--api-key-file " + file + ": no key in it");
  }
  if (keys.empty())
    if (const char* env = std::getenv("STEP35_API_KEY"); env && *env) keys = split_list(env);
  return keys;
}

// --reasoning-effort-budgets LOW,MEDIUM,HIGH.
static void parse_effort_budgets(const std::string& value, server::ReasoningDefaults& r) {
  const std::vector<std::string> b = split_list(value);
  int32_t v[3] = {0, 0, 0};
  bool ok = b.size() == 3;
  for (size_t i = 0; ok && i < 3; ++i) {
    char* end = nullptr;
    const long long x = std::strtoll(b[i].c_str(), &end, 10);
    ok = *end == '\0' && x >= -1 && x <= (1 << 24);
    v[i] = int32_t(x);
  }
  if (!ok)
    throw UsageError("--reasoning-effort-budgets expects three token counts LOW,MEDIUM,HIGH (-1: unbounded), got '" +
                     value + "'");
  r.low = v[0];
  r.medium = v[1];
  r.high = v[2];
}

namespace {

// serve's flags that are not fields of ServerOptions as they stand: sizes in other units,
// and lists and names parsed once all flags are read.
struct ServeFlags {
  explicit ServeFlags(const server::ServerOptions& o)
      : kv_mib(o.engine.kv_bytes >> 20),
        max_body(int64_t(o.max_body_bytes)),
        image_cache_mib(int64_t(o.image_cache_bytes >> 20)),
        image_url_mib(int64_t(o.image_fetch.max_bytes >> 20)),
        effort_budgets(std::to_string(o.reasoning.low) + "," + std::to_string(o.reasoning.medium) + "," +
                       std::to_string(o.reasoning.high)) {}
  int64_t kv_mib, max_body, image_cache_mib, image_url_mib;
  std::string effort_budgets;
  std::string expert_policy = "strict", mtp = "0", api_key, api_key_file, cors, log_format = "text", mem_budget;
  bool exact = false, log_steps = false;
};

}  // namespace

// The model and what comes with it.
static void add_serve_model_flags(ArgParser& p, server::ServerOptions& o, ServeFlags& f) {
  p.option("-m,--model", "FILE", "GGUF model (first part of a split model)", o.model_path, "the built-in tiny model");
  add_mtp_model_flag(p, o.mtp_model);
  add_mem_budget_flag(p, f.mem_budget);
  p.option("--mmproj", "FILE", "vision tower (Step-3.7's step3vl mmproj GGUF): chat requests may then hold pictures "
           "(OpenAI image_url parts, Anthropic image blocks, Responses input_image) as base64 data: URLs", o.mmproj,
           "text only");
  p.option("--image-cache", "MIB", "embeddings of recent pictures kept, so that a picture sent again (the same "
           "screenshot in the next turn) is not encoded again; 0: none", f.image_cache_mib, 0, int64_t(1) << 24);
  p.option("--allow-image-urls", "also fetch pictures given by http(s) URL (OpenAI image_url, Anthropic url "
           "sources, Responses input_image); any client can then make the server connect wherever it can reach",
           o.image_fetch.allow);
  p.option("--image-url-timeout", "S", "seconds one picture fetch may take, redirects included",
           o.image_fetch.timeout_s, 0.1, 3600);
  p.option("--image-url-max", "MIB", "largest picture file fetched", f.image_url_mib, 1, 4096);
  p.option("--alias", "NAME", "model id reported by /v1/models", o.model_id, "the model file name");
  p.option("--chat-template-file", "FILE", "Jinja chat template to render requests with, instead of the model "
           "file's tokenizer.chat_template", o.chat_template_file, "the model file's");
}

// Where the server listens and how much it runs at once.
static void add_serve_capacity_flags(ArgParser& p, server::ServerOptions& o, ServeFlags& f) {
  EngineOptions& e = o.engine;
  p.option("--host", "ADDR", "address to listen on", o.host);
  p.option("--port", "N", "TCP port (0: any free port, printed at start); a port in use is an error (exit 1)", o.port,
           0, 65535);
  p.option("--parallel", "N", "sequences generated together at most", e.n_parallel, 1, 1024);
  p.option("-c,--ctx-size", "N", "context size per sequence in tokens, prompt and answer (capped at the model's "
           "training context; 0: the model's)", e.n_ctx, 0, 1 << 24);
  add_threads_flag(p, e.n_threads);
  p.option("-b,--batch-size", "N", "tokens per forward pass at most, decode tokens plus prompt chunks", e.n_batch, 1,
           1 << 16);
  p.option("--kv-mem", "MIB", "KV cache pool size in MiB (less than one sequence needs, or more than the pool can "
           "index, is an error naming the limit)", f.kv_mib, 1, int64_t(1) << 30, "enough for --parallel x --ctx-size");
}

// Who may call the server, and the web pages.
static void add_serve_access_flags(ArgParser& p, server::ServerOptions& o, ServeFlags& f) {
  p.option("--api-key", "KEY", "require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every endpoint except "
           "/health, /version and the web pages (401 otherwise); several keys comma-separated", f.api_key,
           "$STEP35_API_KEY");
  p.option("--api-key-file", "FILE", "API keys, one per line (blank lines and # comments skipped), besides --api-key",
           f.api_key_file);
  p.option("--cors", "ORIGINS", "answer browsers from these origins (comma-separated, or *) with CORS headers, "
           "preflight requests included", f.cors, "no CORS headers");
  p.option("--no-webui", "no web pages: / (the chat page) and /dashboard answer 404 (the API, "
           "/v1/step35/dashboard included, stays)", o.webui, false);
}

// What requests get when they leave it out, and the limits they meet.
static void add_serve_request_flags(ArgParser& p, server::ServerOptions& o, ServeFlags& f) {
  EngineOptions& e = o.engine;
  // Sampling for requests that leave it out: the flags of `run`, with OpenAI's defaults.
  add_sampling_flags(p, o.sampling);
  p.option("--reasoning-budget", "N", "reasoning tokens for requests that ask for no budget (-1: unbounded, 0: no "
           "reasoning)", o.reasoning.budget, -1, 1 << 24);
  p.option("--reasoning-effort-budgets", "L,M,H", "reasoning tokens for reasoning_effort low, medium, high "
           "(-1: unbounded)", f.effort_budgets);
  p.option("--max-queue", "N", "requests waiting beyond the running ones; more get 503 with Retry-After", e.max_queue,
           0, 1 << 20);
  p.option("--timeout", "S", "per-request time limit in seconds (408 when exceeded)", o.timeout_s, 0.001, 1e7);
  p.option("--max-body", "BYTES", "request body size limit, whatever the content type (413 beyond)", f.max_body, 1024,
           int64_t(1) << 32);
  p.option("--max-n", "N", "choices per request (n, best_of) at most", o.max_n, 1, 128);
  p.option("--batch-wait-ms", "MS", "how long high_throughput requests may wait to join a larger batch",
           e.batch_wait_ms, 0, 60000);
}

// How the engine computes: expert policy, prefix reuse, speculation, precision.
static void add_serve_decoding_flags(ArgParser& p, server::ServerOptions& o, ServeFlags& f) {
  p.option("--expert-policy", "P", "what expert_policy 'auto' means: strict (the model's top-k) or adaptive",
           f.expert_policy);
  add_adaptive_policy_flags(p, o.adaptive_mass, o.adaptive_min_k);
  p.option("--no-prefix-cache", "do not reuse KV blocks of identical prompt prefixes", o.engine.prefix_cache, false);
  p.option("--mtp", "K", "MTP speculative decoding: 0.." + std::to_string(kMaxDrafts) + " drafts per step, or auto (K "
           "chosen per step from acceptance and measured cost); needs a model with MTP blocks. Acceptance per draft "
           "position is in /metrics (step35_mtp_drafts_total, step35_mtp_accepted_total, step35_mtp_acceptance_rate, "
           "label position)", f.mtp);
  p.option("--exact", "F32 activations on the exact stored weights (default: round activations as llama.cpp does)",
           f.exact);
}

// HTTP connections and logging.
static void add_serve_connection_flags(ArgParser& p, server::ServerOptions& o, ServeFlags& f) {
  p.option("--http-threads", "N", "HTTP worker threads", o.http_threads, 1, 4096,
           "enough for every running and queued request");
  p.option("--keep-alive", "S", "seconds an idle connection keeps its HTTP thread, before its first request or "
           "between keep-alive requests (httplib's own default is 5): with more idle connections than threads, a new "
           "request waits at most about this long", o.keep_alive_s, 1, 3600);
  p.option("--read-timeout", "S", "seconds a client may go silent while sending its request (line, headers or body) "
           "before the connection is dropped", o.read_timeout_s, 1, 3600);
  p.option("--shutdown-grace", "S", "on SIGTERM, seconds in-flight requests may finish before they are cancelled",
           o.shutdown_grace_s, 0, 3600);
  p.option("--log-disable", "no access log line per request", o.access_log, false);
  p.option("--log-format", "F", "log lines as text ('step35 serve: ...') or json (one object per line)", f.log_format);
  p.option("--log-steps", "one line per forward pass on stderr (decode tokens and sequences, prompt tokens and "
           "chunks, forward time); bench/step_log_summary.sh LOG sums a run's passes by kind", f.log_steps);
}

static ArgParser serve_parser(server::ServerOptions& o, ServeFlags& f) {
  ArgParser p("serve", "Serves the model over HTTP: OpenAI chat/completions/responses, Anthropic messages,\n"
                       "/v1/step35/execute, /tokenize, /detokenize, /props, /health and Prometheus /metrics (see\n"
                       "docs/server.md). Many requests run together (continuous batching). Stops cleanly on\n"
                       "SIGTERM / SIGINT.");
  add_serve_model_flags(p, o, f);
  add_serve_capacity_flags(p, o, f);
  add_serve_access_flags(p, o, f);
  add_serve_request_flags(p, o, f);
  add_serve_decoding_flags(p, o, f);
  add_serve_connection_flags(p, o, f);
  add_kv_cache_flags(p, o.engine.kv_types);
  add_patch_flag(p, o.patches);
  add_ep_flags(p);
  return p;
}

// The flags kept aside, checked and stored into the options (UsageError for a bad one).
static void apply_serve_flags(const ArgParser& p, const ServeFlags& f, server::ServerOptions& o) {
  EngineOptions& e = o.engine;
  o.api_keys = api_keys(f.api_key, f.api_key_file);
  o.mem_budget = parse_mem_size(f.mem_budget);
  o.cors_origins = split_list(f.cors);
  if (p.has("cors") && o.cors_origins.empty()) throw UsageError("--cors expects origins (or *), got nothing");
  if (f.log_format != "text" && f.log_format != "json")
    throw UsageError("--log-format expects text or json, got '" + f.log_format + "'");
  o.log_format = f.log_format == "json" ? server::LogFormat::Json : server::LogFormat::Text;
  parse_effort_budgets(f.effort_budgets, o.reasoning);
  o.max_body_bytes = size_t(f.max_body);
  o.image_cache_bytes = size_t(f.image_cache_mib) << 20;
  o.image_fetch.max_bytes = size_t(f.image_url_mib) << 20;
  o.default_expert_policy = adaptive_expert_policy(f.expert_policy) ? ExpertPolicy::Adaptive : ExpertPolicy::Strict;
  e.kv_bytes = f.kv_mib << 20;
  const MtpSetting mtp_setting = parse_mtp_value(f.mtp);  // the model is loaded later, in serve()
  e.mtp = mtp_setting.max_k;
  e.mtp_adaptive = mtp_setting.adaptive;
  e.precision = f.exact ? Precision::Exact : Precision::Native;
  if (f.log_steps) e.on_step = log_step;
}

static int serve_main(const Args& args) {
  server::ServerOptions o;
  o.engine.n_threads = default_threads();
  ServeFlags f(o);
  ArgParser p = serve_parser(o, f);
  if (!p.parse(args)) return 0;
  // With --ep under mpirun, ranks > 0 only compute their experts for rank 0, which serves.
  EpSetup ep(p);

  if (o.model_path.empty()) {
    o.model_path = builtin_tiny_model_path();
    std::fprintf(stderr, "note: no -m given, serving the built-in tiny model (%s): random weights, gibberish text.\n",
                 o.model_path.c_str());
  }
  apply_serve_flags(p, f, o);
  if (ep.is_follower()) return ep.follow(o.model_path, o.engine.n_threads, o.mtp_model, o.mem_budget);
  o.on_model_loaded = [&ep](Model& model) { ep.attach(model); };
  return server::serve(o);
}

int cmd_serve(const Args& args) { return run_guarded("serve", serve_main, args); }

}  // namespace step35::cli
