// step35 finetune: train chosen experts, routers and shared experts of a model on a text
// (every other weight frozen) and write the trained slices as a patch file.
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "patch/patch.h"
#include "exec/thread_pool.h"
#include "train/finetune.h"

namespace step35::cli {

namespace {

std::string read_text(const std::string& path, const char* flag) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UsageError(std::string(flag) + " " + path + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

double peak_rss_mib() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // KiB on Linux
}

nlohmann::json loss_or_null(const train::LossStats& s, bool routed) {
  if (routed) return s.n_routed ? nlohmann::json(s.routed_loss()) : nlohmann::json(nullptr);
  return s.n_targets ? nlohmann::json(s.loss()) : nlohmann::json(nullptr);
}

nlohmann::json skew_json(const std::map<int32_t, double>& skew) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [layer, x] : skew) j[std::to_string(layer)] = x;
  return j;
}

// The progress bar: redrawn in place on a terminal, a line every tenth of the run otherwise.
class Progress {
 public:
  explicit Progress(int64_t steps) : tty_(isatty(2) != 0), every_(std::max<int64_t>(1, steps / 10)) {}
  void update(const train::StepInfo& s) {
    if (!tty_ && s.step % every_ != 0 && s.step != s.steps) return;
    const int width = 30, done = s.steps ? int(width * s.step / s.steps) : width;
    std::fprintf(stderr, "%sfinetune [%.*s%*s] %lld/%lld loss %.4f | %.0f tok/s | lr %.2e | grad %.3f | %.0f s%s",
                 tty_ ? "\r" : "", done, "==============================", width - done, "",
                 static_cast<long long>(s.step), static_cast<long long>(s.steps), s.loss, s.tokens_per_s, s.lr,
                 s.grad_norm, s.elapsed_s, tty_ ? "" : "\n");
    if (tty_ && s.step == s.steps) std::fputc('\n', stderr);
  }

 private:
  bool tty_;
  int64_t every_;
};

int finetune_main(const Args& args) {
  ArgParser p("finetune",
              "Trains the named experts, routers and shared experts of a model on a text with every other weight\n"
              "frozen (frozen weights of any type, multiplied as eval does; F32 gradients), evaluates the training and\n"
              "held-out loss before and after, and writes the trained slices as a patch file (step35 patch, --patch).\n"
              "GROUPS: experts=L:E,L:E (or L:topN, the N experts of layer L the text routes to most); router=L,L;\n"
              "shared=L; several joined with ';', e.g. \"experts=12:top2;router=12\".");
  train::FinetuneSettings s;
  s.adamw.warmup_steps = 10;
  std::string model_path, train_path, eval_path, groups, out_path, storage_name = "base";
  int32_t ctx = 128, n_threads = default_threads();
  bool json = false;
  p.option("-m,--model", "FILE", "GGUF model to adapt", model_path);
  p.option("-f,--file", "FILE", "training text", train_path);
  p.option("--eval-file", "FILE", "held-out text evaluated before and after (not trained on)", eval_path);
  p.option("--train", "GROUPS", "what to train (see above)", groups);
  p.option("--out", "FILE", "patch file to write", out_path);
  p.option("--steps", "N", "optimizer steps", s.steps, 0, int64_t(1) << 32);
  p.option("--lr", "X", "AdamW learning rate", s.adamw.lr, 0, 10);
  p.option("--warmup", "N", "steps over which the learning rate rises linearly to --lr", s.adamw.warmup_steps, 0,
           int64_t(1) << 32);
  p.option("--clip", "X", "clip the gradient's global norm to X (0: no clipping)", s.adamw.clip_norm, 0, 1e9);
  p.option("--weight-decay", "X", "AdamW decoupled weight decay", s.adamw.weight_decay, 0, 10);
  p.option("-b,--batch-size", "N", "windows of the text per step", s.batch, 1, 1 << 16);
  p.option("-c,--ctx-size", "N", "tokens per window", ctx, 1, 1 << 20);
  p.option("--seed", "S", "seed of the window order (a run is reproducible with it)", s.seed);
  p.option("--balance-weight", "X", "weight of the expert-group balance loss G * sum_g f_g * p_g at trained routers",
           s.balance_weight, 0, 1e6);
  p.option("--balance-groups", "G", "expert groups of the balance loss (must divide the expert count)",
           s.balance_groups, 1, 1 << 20, "one group per expert");
  p.option("--eval-windows", "N", "windows each evaluation covers at most", s.eval_windows, 1, INT64_MAX, "all");
  p.option("--patch-type", "T", "how the patch stores slices: base (the model tensor's type, re-quantized), f16 or f32",
           storage_name);
  add_threads_flag(p, n_threads);
  bool exact = false;
  p.option("--exact",
           "forward products of quantized frozen weights on F32 activations (as eval --exact), not the engine's "
           "integer kernels (as eval and serve; several times faster)",
           exact);
  p.option("--json", "print one JSON object with the results to stdout", json);
  if (!p.parse(args)) return 0;
  s.precision = exact ? Precision::Exact : Precision::Native;
  for (const char* required : {"model", "file", "train", "out"})
    if (!p.has(required)) throw UsageError(std::string("--") + required + " is required");
  try {
    s.groups = train::TrainGroups::parse(groups);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (storage_name != "base" && storage_name != "f16" && storage_name != "f32")
    throw UsageError("--patch-type expects base, f16 or f32, got '" + storage_name + "'");
  const patch::Storage storage = storage_name == "f16"   ? patch::Storage::F16
                                 : storage_name == "f32" ? patch::Storage::F32
                                                         : patch::Storage::BaseType;

  const std::string train_text = read_text(train_path, "--file");
  const std::string eval_text = eval_path.empty() ? "" : read_text(eval_path, "--eval-file");
  Model::LoadOptions lo;
  lo.verbose = false;
  lo.repack = false;  // training reads the file's rows, never the repacked copies
  std::unique_ptr<Model> model = Model::load(model_path, lo);
  const Tokenizer& tok = model->tokenizer();
  std::unique_ptr<train::TokenWindows> train_data, eval_data;
  try {
    train_data = std::make_unique<train::TokenWindows>(tok.encode(train_text, true, false), ctx);
    if (!eval_path.empty()) eval_data = std::make_unique<train::TokenWindows>(tok.encode(eval_text, true, false), ctx);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }

  ThreadPool pool(n_threads);
  std::unique_ptr<train::Finetuner> ft;
  try {
    ft = std::make_unique<train::Finetuner>(*model, s, pool);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  ft->prepare(*train_data);
  train::TrainedParams& params = ft->params();
  std::fprintf(stderr, "finetune: %s | train %s (%lld values, %.1f MiB in F32) | %lld training windows of %d tokens%s\n",
               model_path.c_str(), ft->groups().to_string().c_str(), static_cast<long long>(params.n_values()),
               double(params.n_values()) * 4 / (1 << 20), static_cast<long long>(train_data->size()), ctx,
               eval_data ? (", " + std::to_string(eval_data->size()) + " held-out").c_str() : "");
  // Refuse an impossible storage type before spending time on training.
  for (const train::TrainedTensor& t : params.tensors())
    patch::make_slice(*model, t.tensor, t.expert, t.value.data(), storage);

  const train::Evaluation train_before = ft->evaluate(*train_data);
  train::Evaluation eval_before;
  if (eval_data) eval_before = ft->evaluate(*eval_data);
  std::fprintf(stderr, "before: train loss %.4f (routed %.4f over %lld tokens)%s\n", train_before.stats.loss(),
               train_before.stats.routed_loss(), static_cast<long long>(train_before.stats.n_routed),
               eval_data ? (", held-out loss " + std::to_string(eval_before.stats.loss())).c_str() : "");

  Progress progress(s.steps);
  const train::TrainSummary sum = ft->train(*train_data, [&](const train::StepInfo& si) { progress.update(si); });

  // The patch stores the slices in its type; the "after" figures are of those stored
  // values, i.e. of the patched model.
  patch::Patch out;
  out.base_name = model->file().opt_str("general.name").value_or("");
  for (train::TrainedTensor& t : params.tensors()) {
    out.slices.push_back(patch::make_slice(*model, t.tensor, t.expert, t.value.data(), storage));
    t.value = patch::decode_slice(out.slices.back());
  }
  const train::Evaluation train_after = ft->evaluate(*train_data);
  train::Evaluation eval_after;
  if (eval_data) eval_after = ft->evaluate(*eval_data);

  out.train_text = {{"groups", ft->groups().to_string()},
                    {"train_file", base_name(train_path)},
                    {"eval_file", eval_path.empty() ? "" : base_name(eval_path)},
                    {"storage", storage_name}};
  out.train_numbers = {{"steps", double(s.steps)},
                       {"lr", s.adamw.lr},
                       {"warmup", double(s.adamw.warmup_steps)},
                       {"clip", s.adamw.clip_norm},
                       {"weight_decay", s.adamw.weight_decay},
                       {"batch", double(s.batch)},
                       {"ctx", double(ctx)},
                       {"seed", double(s.seed)},
                       {"balance_weight", s.balance_weight},
                       {"balance_groups", double(s.balance_groups)},
                       {"train_loss_before", train_before.stats.loss()},
                       {"train_loss_after", train_after.stats.loss()}};
  if (train_before.stats.n_routed) {
    out.train_numbers["routed_loss_before"] = train_before.stats.routed_loss();
    out.train_numbers["routed_loss_after"] = train_after.stats.routed_loss();
  }
  if (eval_data) {
    out.train_numbers["eval_loss_before"] = eval_before.stats.loss();
    out.train_numbers["eval_loss_after"] = eval_after.stats.loss();
  }
  out.write(out_path);

  std::fprintf(stderr, "after:  train loss %.4f (routed %.4f)%s\n", train_after.stats.loss(),
               train_after.stats.routed_loss(),
               eval_data ? (", held-out loss " + std::to_string(eval_after.stats.loss())).c_str() : "");
  for (const auto& [layer, x] : train_before.skew)
    std::fprintf(stderr, "layer %d expert activation skew (max/mean): %.3f -> %.3f\n", layer, x,
                 train_after.skew.count(layer) ? train_after.skew.at(layer) : 0.0);
  std::fprintf(stderr, "wrote %s: %zu slices, %.2f MiB | %.0f training tokens/s | peak RSS %.1f MiB\n",
               out_path.c_str(), out.slices.size(), double(out.data_bytes()) / (1 << 20), sum.tokens_per_s,
               peak_rss_mib());
  if (json) {
    nlohmann::json j;
    j["train_loss_before"] = loss_or_null(train_before.stats, false);
    j["train_loss_after"] = loss_or_null(train_after.stats, false);
    j["routed_loss_before"] = loss_or_null(train_before.stats, true);
    j["routed_loss_after"] = loss_or_null(train_after.stats, true);
    j["eval_loss_before"] = eval_data ? loss_or_null(eval_before.stats, false) : nlohmann::json(nullptr);
    j["eval_loss_after"] = eval_data ? loss_or_null(eval_after.stats, false) : nlohmann::json(nullptr);
    j["steps"] = sum.steps;
    j["tokens_per_s"] = sum.tokens_per_s;
    j["seconds"] = sum.seconds;
    j["train_tokens"] = train_before.stats.n_targets;
    j["routed_tokens"] = train_before.stats.n_routed;
    j["eval_tokens"] = eval_data ? eval_before.stats.n_targets : 0;
    j["groups"] = ft->groups().to_string();
    j["trained_values"] = params.n_values();
    j["skew_before"] = skew_json(train_before.skew);
    j["skew_after"] = skew_json(train_after.skew);
    j["losses"] = sum.losses;
    j["patch"] = out_path;
    j["patch_bytes"] = out.data_bytes();
    j["peak_rss_mib"] = peak_rss_mib();
    j["activation_mib"] = double(ft->activation_bytes()) / (1 << 20);
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

}  // namespace

int cmd_finetune(const Args& args) { return run_guarded("finetune", finetune_main, args); }

}  // namespace step35::cli
