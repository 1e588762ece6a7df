// step35 eval: run token ids as one batch and print logits / argmax / greedy continuation
// as JSON (the procedure the fixtures' goldens were made with).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "args.h"
#include "model/session.h"
#include "commands.h"
#include "common.h"
#include "ep_options.h"
#include "engine/sampler.h"
#include "exec/thread_pool.h"

namespace step35::cli {

static int eval_main(const Args& args) {
  ArgParser p("eval", "Runs the given token ids through the model as one batch and prints JSON:\n"
                      "{\"n_vocab\":V,\"n_tokens\":N,\"argmax\":[one per position],\"logits\":[[last row]]"
                      " or every row with --all-logits,\"greedy\":[N tokens with --greedy N]}");
  p.flag("-m,--model", "FILE", "GGUF model");
  p.flag("--tokens", "IDS", "comma-separated token ids");
  p.flag("--all-logits", "", "print the logits of every position, not only the last");
  p.flag("--greedy", "N", "then generate N tokens greedily, one at a time through the KV cache "
                          "(end-of-sequence not treated specially)", "0");
  p.flag("-t,--threads", "N", "worker threads", "number of cores");
  p.flag("-c,--ctx-size", "N", "context size", "prompt + greedy tokens");
  p.flag("-b,--batch-size", "N", "largest batch run at once (longer prompts run in chunks)", "512");
  p.flag("--hidden", "", "also print \"hidden\": the last trunk layer's output (MTP input) per position");
  p.flag("--exact", "", "F32 activations on the exact stored weights (default: round activations as llama.cpp does)");
  add_patch_flag(p);
  add_ep_flags(p);
  if (!p.parse(args)) return 0;
  if (!p.has("model")) throw UsageError("-m MODEL is required");
  if (!p.has("tokens")) throw UsageError("--tokens is required");
  const auto tokens = parse_token_list(p.str("tokens"));
  const int n_greedy = int(p.i64("greedy", 0, 0, 1 << 20));
  const int n_threads = int(p.i64("threads", default_threads(), 1, 1024));
  const int n_batch = int(p.i64("batch-size", 512, 1, 1 << 16));
  const int64_t need = int64_t(tokens.size()) + n_greedy;
  const int n_ctx = int(p.i64("ctx-size", need, 1, 1 << 30));
  if (need > n_ctx)
    throw UsageError(std::to_string(tokens.size()) + " tokens + " + std::to_string(n_greedy) +
                     " greedy tokens exceed the context size " + std::to_string(n_ctx));

  EpSetup ep(p);
  if (ep.is_follower()) return ep.follow(p.str("model"), n_threads);
  auto model = load_model(p.str("model"));
  apply_patch_flags(*model, p);
  ep.attach(*model);
  const int n_vocab = model->hparams().n_vocab;
  Session session(*model, n_ctx, std::min<int>(n_batch, n_ctx), p.has("exact") ? Precision::Exact : Precision::Native);
  print_kv_cache(session.cache());
  ThreadPool pool(n_threads);

  std::vector<float> logits, hidden;
  session.forward(tokens.data(), int32_t(tokens.size()), true, logits, pool, p.has("hidden") ? &hidden : nullptr);
  nlohmann::json out;
  out["n_vocab"] = n_vocab;
  out["n_tokens"] = tokens.size();
  nlohmann::json argmax = nlohmann::json::array(), rows = nlohmann::json::array();
  for (size_t t = 0; t < tokens.size(); ++t) {
    const float* row = logits.data() + t * size_t(n_vocab);
    argmax.push_back(Sampler::argmax(row, size_t(n_vocab)));
    if (p.has("all-logits") || t + 1 == tokens.size()) rows.push_back(std::vector<float>(row, row + n_vocab));
  }
  out["argmax"] = argmax;
  out["logits"] = rows;
  if (p.has("hidden")) {
    const size_t E = size_t(model->hparams().n_embd);
    nlohmann::json h = nlohmann::json::array();
    for (size_t t = 0; t < tokens.size(); ++t)
      h.push_back(std::vector<float>(hidden.begin() + t * E, hidden.begin() + (t + 1) * E));
    out["hidden"] = h;
  }
  if (n_greedy > 0) {
    std::vector<int32_t> greedy;
    int32_t next = Sampler::argmax(logits.data() + (tokens.size() - 1) * size_t(n_vocab), size_t(n_vocab));
    for (int i = 0; i < n_greedy; ++i) {
      greedy.push_back(next);
      if (i + 1 == n_greedy) break;
      std::vector<float> step;
      session.forward(&next, 1, false, step, pool);
      next = Sampler::argmax(step.data(), size_t(n_vocab));
    }
    out["greedy"] = greedy;
  }
  std::string s = out.dump();
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

int cmd_eval(const Args& args) { return run_guarded("eval", eval_main, args); }

}  // namespace step35::cli
