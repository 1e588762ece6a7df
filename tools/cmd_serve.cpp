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
// and # comments skipped), else $STEP35_API_KEY.
static std::vector<std::string> api_keys(const ArgParser& p) {
  std::vector<std::string> keys = split_list(p.str("api-key"));
  if (p.has("api-key-file")) {
    const std::string path = p.str("api-key-file");
    std::ifstream in(path);
    if (!in) throw UsageError("--api-key-file " + path + ": cannot read it");
    size_t from_file = 0;
    for (std::string line; std::getline(in, line);) {
      while (!line.empty() && (line.back() == '\r' || std::isspace(static_cast<unsigned char>(line.back())))) line.pop_back();
      size_t b = 0;
      while (b < line.size() && std::isspace(static_cast<unsigned char>(line[b]))) ++b;
      line.erase(0, b);
      if (line.empty() || line[0] == '#') continue;
      keys.push_back(line);
      ++from_file;
    }
    if (from_file == 0) throw UsageError("--api-key-file " + path + ": no key in it");
  }
  if (keys.empty())
    if (const char* env = std::getenv("STEP35_API_KEY"); env && *env) keys = split_list(env);
  return keys;
}

static int serve_main(const Args& args) {
  ArgParser p("serve", "Serves the model over HTTP: OpenAI chat/completions/responses, Anthropic messages,\n"
                       "/v1/step35/execute, /tokenize, /detokenize, /props, /health and Prometheus /metrics (see\n"
                       "docs/server.md). Many requests run together (continuous batching). Stops cleanly on\n"
                       "SIGTERM / SIGINT.");
  p.flag("-m,--model", "FILE", "GGUF model (first part of a split model)", "the built-in tiny model");
  p.flag("--alias", "NAME", "model id reported by /v1/models", "the model file name");
  p.flag("--host", "ADDR", "address to listen on", "127.0.0.1");
  p.flag("--port", "N", "TCP port (0: any free port, printed at start); a port in use is an error", "8080");
  p.flag("--parallel", "N", "sequences generated together at most", "4");
  p.flag("-c,--ctx-size", "N", "context size per sequence in tokens (prompt + answer; 0: the model's)",
         "4096, at most the model's");
  p.flag("-t,--threads", "N", "worker threads", "number of cores");
  p.flag("-b,--batch-size", "N", "tokens per forward pass at most (decode + prompt chunks)", "512");
  p.flag("--kv-mem", "MIB", "KV cache pool size in MiB", "enough for --parallel x --ctx-size");
  p.flag("--api-key", "KEY", "require 'Authorization: Bearer KEY' (or x-api-key) on every endpoint but /health; "
         "several keys comma-separated", "$STEP35_API_KEY");
  p.flag("--api-key-file", "FILE", "API keys, one per line (blank lines and # comments skipped), besides --api-key");
  p.flag("--cors", "ORIGINS", "answer browsers from these origins (comma-separated, or *) with CORS headers",
         "no CORS headers");
  p.flag("--temp", "T", "temperature for requests that give none", "1");
  p.flag("--top-p", "P", "top_p for requests that give none", "1");
  p.flag("--top-k", "K", "top_k for requests that give none (0 = off)", "0");
  p.flag("--min-p", "P", "min_p for requests that give none (0 = off)", "0");
  p.flag("--reasoning-budget", "N", "reasoning tokens for requests that ask for no budget (-1: unbounded, 0: no "
         "reasoning)", "-1");
  p.flag("--reasoning-effort-budgets", "L,M,H", "reasoning tokens for reasoning_effort low, medium, high "
         "(-1: unbounded)", "512,2048,-1");
  p.flag("--max-queue", "N", "requests waiting beyond the running ones; more get 503 + Retry-After", "64");
  p.flag("--timeout", "S", "per-request time limit in seconds (408 when exceeded)", "600");
  p.flag("--max-body", "BYTES", "request body size limit, whatever the content type (413 beyond)", "8388608");
  p.flag("--max-n", "N", "choices per request (n, best_of) at most", "8");
  p.flag("--batch-wait-ms", "MS", "how long high_throughput requests may wait to join a larger batch", "20");
  p.flag("--expert-policy", "P", "what expert_policy 'auto' means: strict (the model's top-k) or adaptive", "strict");
  add_adaptive_policy_flags(p);
  p.flag("--no-prefix-cache", "", "do not reuse KV blocks of identical prompt prefixes");
  p.flag("--mtp", "K", "MTP speculative decoding: drafts per step 0..3, or auto (0..3 chosen per step from acceptance "
         "and measured cost); needs a model with MTP blocks", "0");
  p.flag("--exact", "", "F32 activations on the exact stored weights (default: round activations as llama.cpp does)");
  p.flag("--http-threads", "N", "HTTP worker threads", "enough for every running and queued request");
  p.flag("--keep-alive", "S", "seconds an idle connection keeps its HTTP thread (before its first request or between "
         "keep-alive requests); bounds how long idle connections can make a new request wait", "2");
  p.flag("--shutdown-grace", "S", "on SIGTERM, seconds in-flight requests may finish before they are cancelled", "10");
  p.flag("--log-disable", "", "no access log line per request");
  p.flag("--log-format", "F", "log lines as text or json (one object per line)", "text");
  p.flag("--log-steps", "", "one line per forward pass on stderr: decode tokens, prompt tokens, forward time");
  add_ep_flags(p);
  if (!p.parse(args)) return 0;
  // With --ep under mpirun, ranks > 0 only compute their experts for rank 0, which serves.
  EpSetup ep(p);

  server::ServerOptions o;
  o.model_path = p.str("model");
  if (o.model_path.empty()) {
    o.model_path = builtin_tiny_model_path();
    std::fprintf(stderr, "note: no -m given, serving the built-in tiny model (%s): random weights, gibberish text.\n",
                 o.model_path.c_str());
  }
  o.model_id = p.str("alias");
  o.host = p.str("host", "127.0.0.1");
  o.port = int(p.i64("port", 8080, 0, 65535));
  o.api_keys = api_keys(p);
  o.cors_origins = split_list(p.str("cors"));
  if (p.has("cors") && o.cors_origins.empty()) throw UsageError("--cors expects origins (or *), got nothing");
  o.access_log = !p.has("log-disable");
  const std::string log_format = p.str("log-format", "text");
  if (log_format != "text" && log_format != "json")
    throw UsageError("--log-format expects text or json, got '" + log_format + "'");
  o.log_format = log_format == "json" ? server::LogFormat::Json : server::LogFormat::Text;
  o.sampling.temperature = float(p.f64("temp", 1.0, 0.0, 2.0));
  o.sampling.top_p = float(p.f64("top-p", 1.0, 0.0, 1.0));
  o.sampling.top_k = int32_t(p.i64("top-k", 0, 0, 1 << 20));
  o.sampling.min_p = float(p.f64("min-p", 0.0, 0.0, 1.0));
  o.reasoning.budget = int32_t(p.i64("reasoning-budget", -1, -1, 1 << 24));
  if (p.has("reasoning-effort-budgets")) {
    const std::vector<std::string> b = split_list(p.str("reasoning-effort-budgets"));
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
                       p.str("reasoning-effort-budgets") + "'");
    o.reasoning.low = v[0];
    o.reasoning.medium = v[1];
    o.reasoning.high = v[2];
  }
  o.timeout_s = p.f64("timeout", 600, 0.001, 1e7);
  o.max_body_bytes = size_t(p.i64("max-body", 8 << 20, 1024, int64_t(1) << 32));
  o.max_n = int(p.i64("max-n", 8, 1, 128));
  o.http_threads = int(p.i64("http-threads", 0, 1, 4096));
  o.keep_alive_s = int(p.i64("keep-alive", 2, 1, 3600));
  o.shutdown_grace_s = p.f64("shutdown-grace", 10, 0, 3600);
  const ExpertPolicySetting policy = parse_expert_policy(p);
  o.default_expert_policy = policy.adaptive ? ExpertPolicy::Adaptive : ExpertPolicy::Strict;
  o.adaptive_mass = policy.mass;
  o.adaptive_min_k = policy.min_k;
  EngineOptions& e = o.engine;
  e.n_threads = int32_t(p.i64("threads", default_threads(), 1, 1024));
  e.n_ctx = p.has("ctx-size") ? int32_t(p.i64("ctx-size", 0, 0, 1 << 24)) : -1;  // 0: the model's; -1: the default
  e.n_parallel = int32_t(p.i64("parallel", 4, 1, 1024));
  e.n_batch = int32_t(p.i64("batch-size", 512, 1, 1 << 16));
  e.max_queue = int32_t(p.i64("max-queue", 64, 0, 1 << 20));
  e.kv_bytes = p.i64("kv-mem", 0, 1, int64_t(1) << 30) << 20;
  e.batch_wait_ms = int32_t(p.i64("batch-wait-ms", 20, 0, 60000));
  e.prefix_cache = !p.has("no-prefix-cache");
  const MtpSetting mtp = parse_mtp_value(p.str("mtp", "0"));  // the model is loaded later, in serve()
  e.mtp = mtp.max_k;
  e.mtp_adaptive = mtp.adaptive;
  e.precision = p.has("exact") ? Precision::Exact : Precision::Native;
  if (p.has("log-steps")) e.on_step = log_step;
  if (ep.is_follower()) return ep.follow(o.model_path, e.n_threads);
  o.on_model_loaded = [&ep](Model& model) { ep.attach(model); };
  return server::serve(o);
}

int cmd_serve(const Args& args) { return run_guarded("serve", serve_main, args); }

}  // namespace step35::cli
