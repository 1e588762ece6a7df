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

// --prompt (with --mmproj and --image): the prompt's text and pictures as llama.cpp's
// libmtmd lays them out, run as one sequence; prints the layout and the pictures' geometry
// besides the logits, argmax and greedy tokens.
static int eval_prompt(const Model& model, const std::string& mmproj, const std::vector<std::string>& image_files,
                       const std::string& prompt, int32_t n_greedy, int32_t n_ctx, bool all_logits, bool exact,
                       KvTypes kv_types, int32_t n_threads, const std::string& dump_embd) {
  ThreadPool pool(n_threads);
  vision::ImagePrompt ip;
  if (image_files.empty()) {
    ip.tokens = model.tokenizer().encode(prompt, true, true);
  } else {
    ip = picture_prompt(model, mmproj, image_files, prompt, pool, true);
  }
  const size_t V = size_t(model.hparams().n_vocab), T = ip.tokens.size();
  const int64_t need = int64_t(T) + n_greedy;
  if (n_ctx == 0) n_ctx = int32_t(std::min<int64_t>(need, 1 << 30));
  if (need > n_ctx)
    throw UsageError(std::to_string(T) + " prompt positions + " + std::to_string(n_greedy) +
                     " greedy tokens exceed the context size " + std::to_string(n_ctx));
  Session session(model, n_ctx, 512, exact ? Precision::Exact : Precision::Native, false, 0, kv_types);
  std::vector<float> logits, step;
  const std::vector<float> rows = ip.image_embeddings.empty() ? std::vector<float>() : ip.dense_embeddings();
  session.forward(ip.tokens.data(), int32_t(T), true, logits, pool, nullptr, nullptr, rows.empty() ? nullptr : rows.data());
  std::vector<int32_t> greedy;
  for (int32_t i = 0; i < n_greedy; ++i) {
    const float* last = i == 0 ? logits.data() + (T - 1) * V : step.data();
    greedy.push_back(int32_t(Sampler::argmax(last, V)));
    if (i + 1 < n_greedy) session.forward(&greedy.back(), 1, false, step, pool);
  }
  if (!dump_embd.empty()) write_file_bytes(dump_embd, ip.image_embeddings.data(), ip.image_embeddings.size() * 4);

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
  add_logits(out, logits, T, V, all_logits);
  if (n_greedy > 0) out["greedy"] = greedy;
  print_json(out);
  return 0;
}

static int eval_main(const Args& args) {
  ArgParser p("eval", "Runs the given token ids through the model as one batch and prints JSON:\n"
                      "{\"n_vocab\":V,\"n_tokens\":N,\"argmax\":[one per position],\"logits\":[[last row]]"
                      " or every row with --all-logits,\"greedy\":[N tokens with --greedy N]}; with --mmproj, "
                      "--image and --prompt also \"prompt_tokens\" (-1 at image positions) and \"images\"");
  std::string model_path, token_list, mtp_model, mmproj, prompt, dump_embd;
  std::vector<std::string> patches, images;
  int32_t n_greedy = 0, n_ctx = 0, n_threads = default_threads();
  bool all_logits = false, want_hidden = false, exact = false;
  GeneratorOptions go;
  p.option("-m,--model", "FILE", "GGUF model", model_path);
  add_mtp_model_flag(p, mtp_model);
  p.option("--tokens", "IDS", "comma-separated token ids", token_list);
  add_picture_flags(p, mmproj, images);
  p.option("--prompt", "TEXT", "text with one <__media__> marker per --image, tokenized with BOS and special tokens "
           "(instead of --tokens)", prompt);
  p.option("--dump-image-embd", "FILE", "write every image chunk's embeddings, in order, as F32", dump_embd);
  p.option("--all-logits", "print the logits of every position, not only the last", all_logits);
  p.option("--greedy", "N", "then generate N tokens greedily through the KV cache (end of generation not special)",
           n_greedy, 0, 1 << 20);
  add_threads_flag(p, n_threads);
  p.option("-c,--ctx-size", "N", "context size", n_ctx, 1, 1 << 30, "prompt + greedy tokens");
  p.option("-b,--batch-size", "N", "largest batch run at once (longer prompts run in chunks)", go.n_batch, 1, 1 << 16);
  p.option("--hidden", "also print the last trunk layer's output per position (the MTP input)", want_hidden);
  p.option("--exact", "F32 activations on the exact stored weights (default: round activations as llama.cpp does)",
           exact);
  add_kv_cache_flags(p, go.kv_types);
  add_patch_flag(p, patches);
  add_ep_flags(p);
  if (!p.parse(args)) return 0;
  if (!p.has("model")) throw UsageError("-m MODEL is required");
  if (p.has("prompt") == p.has("tokens")) throw UsageError("give --tokens or --prompt (with --mmproj and --image)");
  if (!images.empty() && mmproj.empty()) throw UsageError("--image needs --mmproj (the model's vision tower)");
  if (p.has("dump-image-embd") && images.empty()) throw UsageError("--dump-image-embd needs --image");
  EpSetup ep(p);
  if (ep.is_follower()) return ep.follow(model_path, n_threads, mtp_model);
  auto model = load_model(model_path, false, mtp_model);
  if (p.has("prompt")) return eval_prompt(*model, mmproj, images, prompt, n_greedy, n_ctx, all_logits, exact,
                                          go.kv_types, n_threads, dump_embd);
  const auto tokens = parse_token_list(token_list);
  const int64_t need = int64_t(tokens.size()) + n_greedy;
  if (!p.has("ctx-size")) n_ctx = int32_t(std::min<int64_t>(need, 1 << 30));
  if (need > n_ctx)
    throw UsageError(std::to_string(tokens.size()) + " tokens + " + std::to_string(n_greedy) +
                     " greedy tokens exceed the context size " + std::to_string(n_ctx));
  apply_patches(*model, patches);
  ep.attach(*model);
  const size_t V = size_t(model->hparams().n_vocab), E = size_t(model->hparams().n_embd), T = tokens.size();
  go.n_ctx = n_ctx;
  go.precision = exact ? Precision::Exact : Precision::Native;
  Generator gen(*model, go);
  std::fprintf(stderr, "kv cache: %s\n", gen.describe_kv().c_str());
  ThreadPool pool(n_threads);

  // The prompt as one batch (in chunks of -b): every position's logits and hidden rows;
  // then greedy decoding from its last row, one token per pass.
  std::vector<float> logits(T * V), hidden(want_hidden ? T * E : 0);
  SequenceParams params;
  params.prompt = tokens;
  params.sampling.temperature = 0;
  params.stop_at_eog = false;  // end-of-sequence tokens are not special here
  params.max_tokens = n_greedy;
  params.on_prompt_rows = [&](int32_t first, int32_t n, const float* lg, const float* hd) {
    std::copy(lg, lg + size_t(n) * V, logits.begin() + ptrdiff_t(size_t(first) * V));
    if (!hidden.empty()) std::copy(hd, hd + size_t(n) * E, hidden.begin() + ptrdiff_t(size_t(first) * E));
  };
  std::vector<int32_t> greedy;
  gen.start(std::move(params), [&](const GenerateEvent& ev) {
    if (int(greedy.size()) >= n_greedy) return SinkReply::Cancel;
    greedy.push_back(ev.token);
    return int(greedy.size()) < n_greedy ? SinkReply::Continue : SinkReply::Cancel;
  });
  gen.run(pool);

  nlohmann::json out;
  out["n_vocab"] = V;
  out["n_tokens"] = T;
  add_logits(out, logits, T, V, all_logits);
  if (want_hidden) {
    nlohmann::json h = nlohmann::json::array();
    for (size_t t = 0; t < T; ++t) h.push_back(std::vector<float>(hidden.begin() + ptrdiff_t(t * E), hidden.begin() + ptrdiff_t((t + 1) * E)));
    out["hidden"] = h;
  }
  if (n_greedy > 0) out["greedy"] = greedy;
  print_json(out);
  return 0;
}

int cmd_eval(const Args& args) { return run_guarded("eval", eval_main, args); }

}  // namespace step35::cli
