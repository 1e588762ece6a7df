// step35 serve: the OpenAI-compatible HTTP server (src/server) over the continuous-batching engine.
#include <cstdio>

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

static int serve_main(const Args& args) {
  ArgParser p("serve", "Serves the model over HTTP: OpenAI chat/completions, /v1/step35/execute, /tokenize,\n"
                       "/detokenize, /health and Prometheus /metrics (see docs/server.md). Many requests run\n"
                       "together (continuous batching). Stops cleanly on SIGTERM / SIGINT.");
  p.flag("-m,--model", "FILE", "GGUF model (first part of a split model)", "the built-in tiny model");
  p.flag("--alias", "NAME", "model id reported by /v1/models", "the model file name");
  p.flag("--host", "ADDR", "address to listen on", "127.0.0.1");
  p.flag("--port", "N", "TCP port (0: any free port, printed at start)", "8080");
  p.flag("--parallel", "N", "sequences generated together at most", "4");
  p.flag("-c,--ctx-size", "N", "context size per sequence in tokens", "4096, at most the model's");
  p.flag("-t,--threads", "N", "worker threads", "number of cores");
  p.flag("-b,--batch-size", "N", "tokens per forward pass at most (decode + prompt chunks)", "512");
  p.flag("--kv-mem", "MIB", "KV cache pool size in MiB", "enough for --parallel x --ctx-size");
  p.flag("--api-key", "KEY", "require 'Authorization: Bearer KEY' (or x-api-key) on every endpoint but /health");
  p.flag("--max-queue", "N", "requests waiting beyond the running ones; more get 503 + Retry-After", "64");
  p.flag("--timeout", "S", "per-request time limit in seconds (408 when exceeded)", "600");
  p.flag("--max-body", "BYTES", "request body size limit (413 beyond)", "8388608");
  p.flag("--max-n", "N", "choices per request (n) at most", "8");
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
  p.flag("--log-steps", "", "one line per forward pass on stderr: decode tokens, prompt tokens, forward time");
  add_patch_flag(p);
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
  o.api_key = p.str("api-key");
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
  e.n_ctx = int32_t(p.i64("ctx-size", 0, 1, 1 << 24));
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
  o.on_model_loaded = [&ep, &p](Model& model) {
    apply_patch_flags(model, p);
    ep.attach(model);
  };
  return server::serve(o);
}

int cmd_serve(const Args& args) { return run_guarded("serve", serve_main, args); }

}  // namespace step35::cli
