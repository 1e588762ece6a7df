// step35 run: generate text from a prompt, streaming it to stdout; timings to stderr.
#include <chrono>
#include <cstdio>
#include <random>

#include "args.h"
#include "chat/chat_template.h"
#include "commands.h"
#include "common.h"
#include "engine/generator.h"
#include "ep_options.h"
#include "exec/thread_pool.h"
#include "vision/image_prompt.h"

namespace step35::cli {

namespace {

// run's own settings; the others are SamplingParams and GeneratorOptions.
struct RunSettings {
  std::string model, prompt, file, system, mtp, chat_template_file, mtp_model, mmproj, mem_budget;
  std::vector<std::string> patches;  // --patch, in order
  std::vector<std::string> images;   // --image, in order
  int32_t n_predict = 128;
  int32_t threads = default_threads();
  bool chat = false, verbose_prompt = false, ignore_eos = false, special = false, exact = false;
};

std::string read_prompt_file(const std::string& path) {
  FILE* fp = std::fopen(path.c_str(), "rb");
  if (!fp) throw UsageError("cannot read prompt file '" + path + "'");
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, fp)) > 0) text.append(buf, n);
  std::fclose(fp);
  return text;
}

// The prompt's tokens (with --chat, as the template renders the user turn) and, with
// --image, the pictures' rows: llama.cpp's media marker stands for each picture, and a
// prompt without one gets them at its end, as llama-mtmd-cli does.
SequenceParams prompt_params(const RunSettings& rs, bool has_system, const Model& model, std::string prompt,
                             ThreadPool& pool) {
  const Tokenizer& tok = model.tokenizer();
  if (!rs.images.empty() && prompt.find(vision::kMediaMarker) == std::string::npos)
    for (size_t i = 0; i < rs.images.size(); ++i) prompt += vision::kMediaMarker;
  std::string text = prompt;
  bool add_bos = true;
  if (rs.chat) {
    // A template that cannot be read or parsed, or that refuses the conversation, ends the
    // run with its one-line error.
    const ChatTemplate tmpl(ChatTemplateSource::from_model(model.file(), tok, rs.chat_template_file));
    std::vector<ChatMessage> msgs;
    if (has_system) msgs.push_back({"system", rs.system, "", {}, ""});
    msgs.push_back({"user", prompt, "", {}, ""});
    text = tmpl.render(msgs);
    add_bos = !tmpl.starts_with_bos(text);
  }
  if (rs.verbose_prompt) std::fprintf(stderr, "prompt:\n%s\n", text.c_str());
  SequenceParams params;
  if (rs.images.empty()) {
    params.prompt = tok.encode(text, add_bos, rs.chat);
    return params;
  }
  vision::ImagePrompt ip = picture_prompt(model, rs.mmproj, rs.images, text, pool, add_bos);
  auto rows = std::make_shared<PromptEmbeddings>();
  rows->n_embd = model.hparams().n_embd;
  rows->rows = std::move(ip.image_embeddings);
  params.prompt = std::move(ip.tokens);
  params.embeddings = std::move(rows);
  return params;
}

ArgParser run_parser(RunSettings& rs, SamplingParams& sp, GeneratorOptions& go) {
  ArgParser p("run", "Generates text from PROMPT and streams it to stdout; load time, prompt and\n"
                     "generation speed go to stderr. Without -m it uses the built-in tiny model\n"
                     "(random weights: the text is gibberish).");
  p.option("-m,--model", "FILE", "GGUF model (first part of a split model)", rs.model, "the built-in tiny model");
  add_mtp_model_flag(p, rs.mtp_model);
  add_mem_budget_flag(p, rs.mem_budget);
  add_picture_flags(p, rs.mmproj, rs.images);
  p.option("-p,--prompt", "TEXT", "prompt text", rs.prompt);
  p.option("-f,--file", "FILE", "read the prompt from a file", rs.file);
  p.option("-n,--n-predict", "N", "tokens to generate; stops earlier at end of generation", rs.n_predict, 0, 1 << 30);
  p.option("--chat", "wrap the prompt as a user message in the model's chat template", rs.chat);
  p.option("--system", "TEXT", "system message for --chat", rs.system);
  p.option("--chat-template-file", "FILE", "Jinja chat template for --chat, instead of the model file's "
           "tokenizer.chat_template", rs.chat_template_file, "the model file's");
  p.option("--verbose-prompt", "print the prompt (with --chat: as the template rendered it) to stderr before "
           "generating", rs.verbose_prompt);
  add_sampling_flags(p, sp);
  p.flag("--seed", "S", "random seed; a fixed seed reproduces a run", "random, printed");
  add_threads_flag(p, rs.threads);
  p.option("-c,--ctx-size", "N", "context size in tokens", go.n_ctx, 1, 1 << 30,
           std::to_string(go.n_ctx) + ", or the model's training context if that is smaller");
  p.option("-b,--batch-size", "N", "prompt tokens per forward pass", go.n_batch, 1, 1 << 16);
  p.option("--ignore-eos", "keep generating past end-of-generation tokens", rs.ignore_eos);
  p.option("--special", "print control tokens (such as <|im_end|>) in the output", rs.special);
  p.option("--exact", "F32 activations on the exact stored weights (default: round activations as llama.cpp does)",
           rs.exact);
  p.option("--mtp", "K", "MTP speculative decoding: 0.." + std::to_string(kMaxDrafts) + " drafts per step, or auto "
           "(K chosen per step from acceptance and measured cost). auto follows measured speed, so with --seed and "
           "sampling it would make the run depend on timing: the default is then 0 (a fixed K stays reproducible)",
           rs.mtp, "auto when the model has MTP blocks");
  add_kv_cache_flags(p, go.kv_types);
  add_patch_flag(p, rs.patches);
  add_ep_flags(p);
  return p;
}

// -m's model, or the built-in tiny model with a note on what it is (`quiet`: no note).
std::string run_model_path(const RunSettings& rs, bool quiet) {
  if (!rs.model.empty()) return rs.model;
  const std::string path = builtin_tiny_model_path();
  if (!quiet) std::fprintf(stderr,
               "note: no -m given, using the built-in tiny model (%s). It has RANDOM weights, so its "
               "text is gibberish. For real output download a Step-3.5-Flash GGUF and run: step35 run "
               "-m Step-3.5-Flash-Q4_K_S-00001-of-0000N.gguf -p \"...\"\n",
               path.c_str());
  return path;
}

// Adaptive K follows measured speed, so with sampling it would make a seeded run depend
// on timing: a fixed --seed then defaults to plain decoding (a fixed --mtp K stays
// reproducible).
MtpSetting run_mtp_setting(const ArgParser& p, const RunSettings& rs, const SamplingParams& sp, const Model& model) {
  const bool seeded_sampling = sp.temperature > 0 && p.has("seed");
  return parse_mtp(p.has("mtp") ? rs.mtp : model.has_mtp() && !seeded_sampling ? "auto" : "0", model);
}

// Wall times of a run, in seconds.
struct RunTimes {
  double load = 0, prompt = 0, generation = 0;
};

// Generates, streaming the text to stdout as whole UTF-8 characters; sets the prompt's and
// the generation's times. -n is counted here rather than given as the sequence's
// max_tokens: a step near the end still drafts as far as the context allows, as it always
// has, so seeded runs repeat.
void stream_generation(Generator& gen, SequenceParams params, const RunSettings& rs, ThreadPool& pool,
                       const Tokenizer& tok, RunTimes& times) {
  Utf8Stream utf8;
  int n_printed = 0;
  gen.start(std::move(params), [&](const GenerateEvent& ev) {
    const std::string text = utf8.push(tok.token_to_piece(ev.token, rs.special));
    std::fwrite(text.data(), 1, text.size(), stdout);
    return ++n_printed < rs.n_predict ? SinkReply::Continue : SinkReply::Cancel;
  });
  const double t0 = now_seconds();
  std::optional<FinishReason> end = gen.prefill(pool);
  times.prompt = now_seconds() - t0;
  const double t1 = now_seconds();
  while (!end) {
    std::fflush(stdout);
    end = gen.step(pool);
  }
  std::fflush(stdout);
  const Sequence& seq = gen.sequence();
  if (*end == FinishReason::Context)
    std::fprintf(stderr, "\n[context full after %d tokens]\n", seq.n_prompt() + seq.n_generated());
  const std::string rest = utf8.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  times.generation = now_seconds() - t1;
}

void print_speculation(const Generator& gen, const MtpSetting& mtp) {
  const SpeculationStats& st = gen.sequence().speculation_stats();
  std::string acceptance;
  for (int32_t i = 1; i <= kMaxDrafts; ++i) {
    char buf[16];
    std::snprintf(buf, sizeof buf, " %.2f", st.acceptance(i));
    acceptance += buf;
  }
  std::fprintf(stderr,
               "mtp: %s (max %d drafts) | %llu speculative steps, %.2f tokens/step | acceptance by draft position"
               "%s | %llu plain steps\n",
               mtp.adaptive ? "auto" : "fixed", gen.max_k(), (unsigned long long)st.steps, st.mean_tokens_per_step(),
               acceptance.c_str(), (unsigned long long)st.plain_steps);
}

}  // namespace

static int run_main(const Args& args) {
  RunSettings rs;
  SamplingParams sp;
  GeneratorOptions go;
  ArgParser p = run_parser(rs, sp, go);
  if (!p.parse(args)) return 0;

  if (!p.has("prompt") && !p.has("file")) throw UsageError("-p PROMPT (or -f FILE) is required");
  const std::string prompt = p.has("file") ? read_prompt_file(rs.file) : rs.prompt;
  sp.seed = p.has("seed") ? uint64_t(p.i64("seed", 0, 0, INT64_MAX)) : std::random_device{}();

  EpSetup ep(p);
  const std::string path = run_model_path(rs, ep.is_follower());
  if (ep.is_follower()) return ep.follow(path, rs.threads, rs.mtp_model, parse_mem_size(rs.mem_budget));
  RunTimes times;
  const double t_load0 = now_seconds();
  auto model = load_model(path, false, rs.mtp_model, {parse_mem_size(rs.mem_budget), go.n_ctx, go.kv_types});
  apply_patches(*model, rs.patches);
  ep.attach(*model);
  times.load = now_seconds() - t_load0;
  ThreadPool pool(rs.threads);

  if (!rs.chat && p.has("chat-template-file")) throw UsageError("--chat-template-file needs --chat");
  SequenceParams params = prompt_params(rs, p.has("system"), *model, prompt, pool);
  const size_t n_prompt = params.prompt.size();
  if (rs.verbose_prompt) std::fprintf(stderr, "prompt tokens: %zu\n", n_prompt);
  if (!p.has("ctx-size")) go.n_ctx = std::min(go.n_ctx, model->hparams().n_ctx_train);
  if (int64_t(n_prompt) >= go.n_ctx)
    throw UsageError("the prompt is " + std::to_string(n_prompt) + " tokens, which does not fit the " +
                     "context of " + std::to_string(go.n_ctx) + " tokens (raise -c)");
  const MtpSetting mtp = run_mtp_setting(p, rs, sp, *model);
  go.precision = rs.exact ? Precision::Exact : Precision::Native;
  go.mtp = mtp.max_k;
  go.mtp_adaptive = mtp.adaptive;
  Generator gen(*model, go);
  std::fprintf(stderr, "kv cache: %s\n", gen.describe_kv().c_str());

  params.sampling = sp;
  params.stop_at_eog = !rs.ignore_eos;
  stream_generation(gen, std::move(params), rs, pool, model->tokenizer(), times);
  const int n_gen = gen.sequence().n_generated();
  std::fprintf(stderr,
               "\ntimings: load %.0f ms | prompt %zu tokens in %.1f ms (%.1f tok/s) | generation %d tokens in "
               "%.1f ms (%.1f tok/s) | %d threads, seed %llu\n",
               times.load * 1e3, n_prompt, times.prompt * 1e3, double(n_prompt) / std::max(times.prompt, 1e-9), n_gen,
               times.generation * 1e3, n_gen / std::max(times.generation, 1e-9), rs.threads,
               (unsigned long long)sp.seed);
  if (gen.max_k() > 0) print_speculation(gen, mtp);
  return 0;
}

int cmd_run(const Args& args) { return run_guarded("run", run_main, args); }

}  // namespace step35::cli
