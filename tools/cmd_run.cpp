// step35 run: generate text from a prompt, streaming it to stdout; timings to stderr.
#include <chrono>
#include <cstdio>
#include <random>

#include "args.h"
#include "model/session.h"
#include "commands.h"
#include "common.h"
#include "ep_options.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "exec/thread_pool.h"
#include "chat/chat_template.h"

namespace step35::cli {

static int run_main(const Args& args) {
  ArgParser p("run", "Generates text from PROMPT and streams it to stdout; load time, prompt and\n"
                     "generation speed go to stderr. Without -m it uses the built-in tiny model\n"
                     "(random weights: the text is gibberish).");
  p.flag("-m,--model", "FILE", "GGUF model (first part of a split model)", "the built-in tiny model");
  p.flag("-p,--prompt", "TEXT", "prompt text");
  p.flag("-f,--file", "FILE", "read the prompt from a file");
  p.flag("-n,--n-predict", "N", "tokens to generate (stops earlier at end of generation)", "128");
  p.flag("--chat", "", "wrap the prompt as a user message in the model's chat template");
  p.flag("--system", "TEXT", "system message for --chat");
  p.flag("--temp", "T", "temperature; 0 = greedy", "0.8");
  p.flag("--top-k", "K", "keep the K most likely tokens; 0 = off", "40");
  p.flag("--top-p", "P", "nucleus sampling threshold; 1 = off", "0.95");
  p.flag("--min-p", "P", "drop tokens below P x the top probability; 0 = off", "0.05");
  p.flag("--repeat-penalty", "X", "penalise recently seen tokens (llama.cpp rule); 1 = off", "1.0");
  p.flag("--repeat-last-n", "N", "how many recent tokens the penalties look at", "64");
  p.flag("--presence-penalty", "X", "subtract X from every token already seen", "0");
  p.flag("--frequency-penalty", "X", "subtract X times the count of each seen token", "0");
  p.flag("--seed", "S", "random seed; a fixed seed reproduces a run", "random");
  p.flag("-t,--threads", "N", "worker threads", "number of cores");
  p.flag("-c,--ctx-size", "N", "context size in tokens", "4096, at most the model's");
  p.flag("-b,--batch-size", "N", "prompt tokens processed per forward pass", "512");
  p.flag("--ignore-eos", "", "keep generating past end-of-generation tokens");
  p.flag("--special", "", "print control tokens (e.g. <|im_end|>) in the output");
  p.flag("--exact", "", "F32 activations on the exact stored weights (default: round activations as llama.cpp does)");
  p.flag("--mtp", "K", "MTP speculative decoding: drafts per step 0..3, or auto (chosen per step from acceptance "
                       "and measured cost; never slower than plain decoding)", "auto when the model has MTP blocks (0 with --seed and sampling)");
  add_patch_flag(p);
  add_ep_flags(p);
  if (!p.parse(args)) return 0;

  std::string prompt = p.str("prompt");
  if (p.has("file")) {
    FILE* fp = std::fopen(p.str("file").c_str(), "rb");
    if (!fp) throw UsageError("cannot read prompt file '" + p.str("file") + "'");
    prompt.clear();
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, fp)) > 0) prompt.append(buf, n);
    std::fclose(fp);
  }
  if (!p.has("prompt") && !p.has("file")) throw UsageError("-p PROMPT (or -f FILE) is required");
  const int n_predict = int(p.i64("n-predict", 128, 0, 1 << 30));
  const int n_threads = int(p.i64("threads", default_threads(), 1, 1024));
  const int n_batch = int(p.i64("batch-size", 512, 1, 1 << 16));
  SamplingParams sp;
  sp.temperature = float(p.f64("temp", 0.8, 0.0, 100.0));
  sp.top_k = int32_t(p.i64("top-k", 40, 0, 1 << 30));
  sp.top_p = float(p.f64("top-p", 0.95, 0.0, 1.0));
  sp.min_p = float(p.f64("min-p", 0.05, 0.0, 1.0));
  sp.repeat_penalty = float(p.f64("repeat-penalty", 1.0, 0.0, 100.0));
  sp.repeat_last_n = int32_t(p.i64("repeat-last-n", 64, 0, 1 << 20));
  sp.presence_penalty = float(p.f64("presence-penalty", 0.0, -100.0, 100.0));
  sp.frequency_penalty = float(p.f64("frequency-penalty", 0.0, -100.0, 100.0));
  sp.seed = p.has("seed") ? uint64_t(p.i64("seed", 0, 0, INT64_MAX)) : std::random_device{}();

  EpSetup ep(p);
  std::string path = p.str("model");
  const bool builtin = path.empty();
  if (builtin) {
    path = builtin_tiny_model_path();
    if (!ep.is_follower()) std::fprintf(stderr,
                 "note: no -m given, using the built-in tiny model (%s). It has RANDOM weights, so its "
                 "text is gibberish. For real output download a Step-3.5-Flash GGUF and run: step35 run "
                 "-m Step-3.5-Flash-Q4_K_S-00001-of-0000N.gguf -p \"...\"\n",
                 path.c_str());
  }
  if (ep.is_follower()) return ep.follow(path, n_threads);
  const double t_load0 = now_seconds();
  auto model = load_model(path);
  apply_patch_flags(*model, p);
  ep.attach(*model);
  const double t_load = now_seconds() - t_load0;
  const Tokenizer& tok = model->tokenizer();

  std::vector<int32_t> tokens;
  if (p.has("chat")) {
    ChatTemplate tmpl(model->file().opt_str("tokenizer.chat_template").value_or(""),
                      tok.bos() >= 0 ? tok.token_to_piece(tok.bos()) : "");
    std::vector<ChatMessage> msgs;
    if (p.has("system")) msgs.push_back({"system", p.str("system"), "", {}, ""});
    msgs.push_back({"user", prompt, "", {}, ""});
    const std::string rendered = tmpl.render(msgs);
    tokens = tok.encode(rendered, !tmpl.renders_bos(), true);
  } else {
    tokens = tok.encode(prompt, true, false);
  }
  const int default_ctx = std::min(4096, model->hparams().n_ctx_train);
  const int n_ctx = int(p.i64("ctx-size", default_ctx, 1, 1 << 30));
  if (int64_t(tokens.size()) >= n_ctx)
    throw UsageError("the prompt is " + std::to_string(tokens.size()) + " tokens, which does not fit the " +
                     "context of " + std::to_string(n_ctx) + " tokens (raise -c)");
  // Adaptive K follows measured speed, so with sampling it would make a seeded run depend
  // on timing: a fixed --seed then defaults to plain decoding (a fixed --mtp K stays
  // reproducible).
  const bool seeded_sampling = sp.temperature > 0 && p.has("seed");
  const MtpSetting mtp = parse_mtp(p.str("mtp", model->has_mtp() && !seeded_sampling ? "auto" : "0"), *model);
  SpeculativeDecoder decoder(*model, n_ctx, std::min(n_batch, n_ctx), p.has("exact") ? Precision::Exact : Precision::Native,
                             mtp.max_k, mtp.adaptive);
  print_kv_cache(decoder.cache());
  ThreadPool pool(n_threads);
  Sampler sampler(sp, size_t(model->hparams().n_vocab));
  for (int32_t t : tokens) sampler.accept(t);

  std::vector<float> logits;
  const double t0 = now_seconds();
  decoder.prefill(tokens.data(), int32_t(tokens.size()), logits, pool);
  const double t_prompt = now_seconds() - t0;

  Utf8Stream utf8;
  const bool special = p.has("special");
  int n_gen = 0;
  const double t1 = now_seconds();
  std::vector<int32_t> produced;
  int32_t pending = sampler.sample(logits.data());
  sampler.accept(pending);
  produced.push_back(pending);
  bool stop = false;
  while (!stop) {
    // Emit what the last step produced (the first token, or accepted drafts + the next).
    for (int32_t t : produced) {
      ++n_gen;
      if (tok.is_eog(t) && !p.has("ignore-eos")) {
        stop = true;
        break;
      }
      const std::string text = utf8.push(tok.token_to_piece(t, special));
      std::fwrite(text.data(), 1, text.size(), stdout);
      if (n_gen >= n_predict) {
        stop = true;
        break;
      }
    }
    std::fflush(stdout);
    if (stop) break;
    pending = produced.back();
    if (decoder.n_pos() + 1 >= decoder.n_ctx()) {
      std::fprintf(stderr, "\n[context full after %d tokens]\n", decoder.n_pos() + 1);
      break;
    }
    produced.clear();
    decoder.step(pending, sampler, produced, pool);
  }
  const std::string rest = utf8.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  const double t_gen = now_seconds() - t1;
  std::fprintf(stderr,
               "\ntimings: load %.0f ms | prompt %zu tokens in %.1f ms (%.1f tok/s) | generation %d tokens in "
               "%.1f ms (%.1f tok/s) | %d threads, seed %llu\n",
               t_load * 1e3, tokens.size(), t_prompt * 1e3, double(tokens.size()) / std::max(t_prompt, 1e-9),
               n_gen, t_gen * 1e3, n_gen / std::max(t_gen, 1e-9), n_threads, (unsigned long long)sp.seed);
  if (decoder.max_k() > 0) {
    const SpeculationStats& st = decoder.stats();
    std::fprintf(stderr,
                 "mtp: %s (max %d drafts) | %llu speculative steps, %.2f tokens/step | acceptance by draft position "
                 "%.2f %.2f %.2f | %llu plain steps\n",
                 mtp.adaptive ? "auto" : "fixed", decoder.max_k(), (unsigned long long)st.steps, st.mean_tokens_per_step(),
                 st.acceptance(1), st.acceptance(2), st.acceptance(3), (unsigned long long)decoder.plain_steps());
  }
  return 0;
}

int cmd_run(const Args& args) { return run_guarded("run", run_main, args); }

}  // namespace step35::cli
