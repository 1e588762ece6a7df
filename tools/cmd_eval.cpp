// step35 eval: run token ids as one batch and print logits / argmax / greedy continuation
// as JSON (the procedure the fixtures' goldens were made with).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "ep_options.h"
#include "exec/thread_pool.h"
#include "model/session.h"
#include "vision/image_prompt.h"

namespace step35::cli {

// The fields every eval prints: argmax of each position, the logit rows (the last, or all
// with --all-logits); then the JSON on one line.
static void add_logits(nlohmann::json& out, const std::vector<float>& logits, size_t T, size_t V, bool all_logits) {
  nlohmann::json argmax = nlohmann::json::array(), rows = nlohmann::json::array();
  for (size_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * V;
    argmax.push_back(Sampler::argmax(row, V));
    if (all_logits || t + 1 == T) rows.push_back(std::vector<float>(row, row + V));
  }
  out["argmax"] = argmax;
  out["logits"] = rows;
}

static void print_json(const nlohmann::json& out) {
  const std::string s = out.dump();
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
}

namespace {

// eval's settings, with their defaults.
struct EvalSettings {
  std::string model_path, token_list, mtp_model, mmproj, prompt, dump_embd, mem_budget;
  std::vector<std::string> patches, images;
  int32_t n_greedy = 0, n_ctx = 0, n_threads = default_threads();
  bool all_logits = false, want_hidden = false, exact = false;
  GeneratorOptions go;  // -b and the KV cache types
};

}  // namespace

static ArgParser eval_parser(EvalSettings& s) {
  ArgParser p("eval", "Runs the given token ids through the model as one batch and prints JSON:\n"
                      "{\"n_vocab\":V,\"n_tokens\":N,\"argmax\":[one per position],\"logits\":[[last row]]"
                      " or every row with --all-logits,\"greedy\":[N tokens with --greedy N]}; with --mmproj, "
                      "--image and --prompt also \"prompt_tokens\" (-1 at image positions) and \"images\"");
  p.option("-m,--model", "FILE", "GGUF model", s.model_path);
  add_mtp_model_flag(p, s.mtp_model);
  add_mem_budget_flag(p, s.mem_budget);
  p.option("--tokens", "IDS", "comma-separated token ids", s.token_list);
  add_picture_flags(p, s.mmproj, s.images);
  p.option("--prompt", "TEXT", "text with one <__media__> marker per --image, tokenized with BOS and special tokens "
           "(instead of --tokens)", s.prompt);
  p.option("--dump-image-embd", "FILE", "write every image chunk's embeddings, in order, as F32", s.dump_embd);
  p.option("--all-logits", "print the logits of every position, not only the last", s.all_logits);
  p.option("--greedy", "N", "then generate N tokens greedily through the KV cache (end of generation not special)",
           s.n_greedy, 0, 1 << 20);
  add_threads_flag(p, s.n_threads);
  p.option("-c,--ctx-size", "N", "context size", s.n_ctx, 1, 1 << 30, "prompt + greedy tokens");
  p.option("-b,--batch-size", "N", "largest batch run at once (longer prompts run in chunks)", s.go.n_batch, 1,
           1 << 16);
  p.option("--hidden", "also print the last trunk layer's output per position (the MTP input)", s.want_hidden);
  p.option("--exact", "F32 activations on the exact stored weights (default: round activations as llama.cpp does)",
           s.exact);
  add_kv_cache_flags(p, s.go.kv_types);
  add_patch_flag(p, s.patches);
  add_ep_flags(p);
  return p;
}

// --prompt (with --mmproj and --image): the prompt's text and pictures as llama.cpp's
// libmtmd lays them out, run as one sequence; prints the layout and the pictures' geometry
// besides the logits, argmax and greedy tokens.
static int eval_prompt(const Model& model, const EvalSettings& s) {
  ThreadPool pool(s.n_threads);
  vision::ImagePrompt ip;
  if (s.images.empty()) {
    ip.tokens = model.tokenizer().encode(s.prompt, true, true);
  } else {
    ip = picture_prompt(model, s.mmproj, s.images, s.prompt, pool, true);
  }
  const size_t V = size_t(model.hparams().n_vocab), T = ip.tokens.size();
  const int64_t need = int64_t(T) + s.n_greedy;
  const int32_t n_ctx = s.n_ctx == 0 ? int32_t(std::min<int64_t>(need, 1 << 30)) : s.n_ctx;
  if (need > n_ctx)
    throw UsageError(std::to_string(T) + " prompt positions + " + std::to_string(s.n_greedy) +
                     " greedy tokens exceed the context size " + std::to_string(n_ctx));
  Session session(model, n_ctx, 512, s.exact ? Precision::Exact : Precision::Native, false, 0, s.go.kv_types);
  std::vector<float> logits, step;
  const std::vector<float> rows = ip.image_embeddings.empty() ? std::vector<float>() : ip.dense_embeddings();
  session.forward(ip.tokens.data(), int32_t(T), true, logits, pool, nullptr, nullptr, rows.empty() ? nullptr : rows.data());
  std::vector<int32_t> greedy;
  for (int32_t i = 0; i < s.n_greedy; ++i) {
    const float* last = i == 0 ? logits.data() + (T - 1) * V : step.data();
    greedy.push_back(int32_t(Sampler::argmax(last, V)));
    if (i + 1 < s.n_greedy) session.forward(&greedy.back(), 1, false, step, pool);
  }
  if (!s.dump_embd.empty())
    write_file_bytes(s.dump_embd, ip.image_embeddings.data(), ip.image_embeddings.size() * 4);

  nlohmann::json out, pics = nlohmann::json::array();
  out["n_vocab"] = V;
  out["n_tokens"] = T;
  out["prompt_tokens"] = ip.tokens;
  for (size_t i = 0; i < ip.plans.size(); ++i) {
    nlohmann::json slices = nlohmann::json::array(), overview;
    for (const auto& c : ip.chunks)
      if (c.image == int32_t(i)) {
        const nlohmann::json one = {{"nx", c.nx}, {"ny", c.ny}, {"n_tokens", c.n_tokens}};
        if (c.overview) overview = one;
        else slices.push_back(one);
      }
    pics.push_back({{"grid_cols", ip.plans[i].grid_cols}, {"grid_rows", ip.plans[i].grid_rows}, {"slices", slices},
                    {"overview", overview}});
  }
  out["images"] = pics;
  add_logits(out, logits, T, V, s.all_logits);
  if (s.n_greedy > 0) out["greedy"] = greedy;
  print_json(out);
  return 0;
}

// --tokens: the prompt as one batch (in chunks of -b), every position's logits and hidden
// rows kept; then greedy decoding from its last row, one token per pass.
static int eval_tokens(const Model& model, const std::vector<int32_t>& tokens, int32_t n_ctx, const EvalSettings& s) {
  const size_t V = size_t(model.hparams().n_vocab), E = size_t(model.hparams().n_embd), T = tokens.size();
  GeneratorOptions go = s.go;
  go.n_ctx = n_ctx;
  go.precision = s.exact ? Precision::Exact : Precision::Native;
  Generator gen(model, go);
  std::fprintf(stderr, "kv cache: %s\n", gen.describe_kv().c_str());
  ThreadPool pool(s.n_threads);

  std::vector<float> logits(T * V), hidden(s.want_hidden ? T * E : 0);
  SequenceParams params;
  params.prompt = tokens;
  params.sampling.temperature = 0;
  params.stop_at_eog = false;  // end-of-sequence tokens are not special here
  params.max_tokens = s.n_greedy;
  params.on_prompt_rows = [&](int32_t first, int32_t n, const float* lg, const float* hd) {
    std::copy(lg, lg + size_t(n) * V, logits.begin() + ptrdiff_t(size_t(first) * V));
    if (!hidden.empty()) std::copy(hd, hd + size_t(n) * E, hidden.begin() + ptrdiff_t(size_t(first) * E));
  };
  std::vector<int32_t> greedy;
  const int32_t n_greedy = s.n_greedy;
  gen.start(std::move(params), [&](const GenerateEvent& ev) {
    if (int(greedy.size()) >= n_greedy) return SinkReply::Cancel;
    greedy.push_back(ev.token);
    return int(greedy.size()) < n_greedy ? SinkReply::Continue : SinkReply::Cancel;
  });
  gen.run(pool);

  nlohmann::json out;
  out["n_vocab"] = V;
  out["n_tokens"] = T;
  add_logits(out, logits, T, V, s.all_logits);
  if (s.want_hidden) {
    nlohmann::json h = nlohmann::json::array();
    for (size_t t = 0; t < T; ++t) h.push_back(std::vector<float>(hidden.begin() + ptrdiff_t(t * E), hidden.begin() + ptrdiff_t((t + 1) * E)));
    out["hidden"] = h;
  }
  if (n_greedy > 0) out["greedy"] = greedy;
  print_json(out);
  return 0;
}

static int eval_main(const Args& args) {
  EvalSettings s;
  ArgParser p = eval_parser(s);
  if (!p.parse(args)) return 0;
  if (!p.has("model")) throw UsageError("-m MODEL is required");
  if (p.has("prompt") == p.has("tokens")) throw UsageError("give --tokens or --prompt (with --mmproj and --image)");
  if (!s.images.empty() && s.mmproj.empty()) throw UsageError("--image needs --mmproj (the model's vision tower)");
  if (p.has("dump-image-embd") && s.images.empty()) throw UsageError("--dump-image-embd needs --image");
  EpSetup ep(p);
  if (ep.is_follower()) return ep.follow(s.model_path, s.n_threads, s.mtp_model, parse_mem_size(s.mem_budget));
  auto model = load_model(s.model_path, false, s.mtp_model,
                          {parse_mem_size(s.mem_budget), s.n_ctx > 0 ? s.n_ctx : 4096, s.go.kv_types});
  if (p.has("prompt")) return eval_prompt(*model, s);
  const auto tokens = parse_token_list(s.token_list);
  const int64_t need = int64_t(tokens.size()) + s.n_greedy;
  const int32_t n_ctx = p.has("ctx-size") ? s.n_ctx : int32_t(std::min<int64_t>(need, 1 << 30));
  if (need > n_ctx)
    throw UsageError(std::to_string(tokens.size()) + " tokens + " + std::to_string(s.n_greedy) +
                     " greedy tokens exceed the context size " + std::to_string(n_ctx));
  apply_patches(*model, s.patches);
  ep.attach(*model);
  return eval_tokens(*model, tokens, n_ctx, s);
}

int cmd_eval(const Args& args) { return run_guarded("eval", eval_main, args); }

}  // namespace step35::cli
