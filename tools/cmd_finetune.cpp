// step35 finetune: train chosen experts, routers and shared experts of a model on a text
// (every other weight frozen) and write the trained slices as a patch file.
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
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

// finetune's settings: the trainer's (warming up over 10 steps unless told otherwise) and
// the command's own, with their defaults.
struct FinetuneOptions {
  FinetuneOptions() { settings.adamw.warmup_steps = 10; }
  train::FinetuneSettings settings;
  std::string model_path, train_path, eval_path, groups, out_path, storage_name = "base";
  int32_t ctx = 128, n_threads = default_threads();
  bool json = false, exact = false;
};

ArgParser finetune_parser(FinetuneOptions& o) {
  ArgParser p("finetune",
              "Trains the named experts, routers and shared experts of a model on a text with every other weight\n"
              "frozen (frozen weights of any type, multiplied as eval does; F32 gradients), evaluates the training and\n"
              "held-out loss before and after, and writes the trained slices as a patch file (step35 patch, --patch).\n"
              "GROUPS: experts=L:E,L:E (or L:topN, the N experts of layer L the text routes to most); router=L,L;\n"
              "shared=L; several joined with ';', e.g. \"experts=12:top2;router=12\".");
  train::FinetuneSettings& s = o.settings;
  p.option("-m,--model", "FILE", "GGUF model to adapt", o.model_path);
  p.option("-f,--file", "FILE", "training text", o.train_path);
  p.option("--eval-file", "FILE", "held-out text evaluated before and after (not trained on)", o.eval_path);
  p.option("--train", "GROUPS", "what to train (see above)", o.groups);
  p.option("--out", "FILE", "patch file to write", o.out_path);
  p.option("--steps", "N", "optimizer steps", s.steps, 0, int64_t(1) << 32);
  p.option("--lr", "X", "AdamW learning rate", s.adamw.lr, 0, 10);
  p.option("--warmup", "N", "steps over which the learning rate rises linearly to --lr", s.adamw.warmup_steps, 0,
           int64_t(1) << 32);
  p.option("--clip", "X", "clip the gradient's global norm to X (0: no clipping)", s.adamw.clip_norm, 0, 1e9);
  p.option("--weight-decay", "X", "AdamW decoupled weight decay", s.adamw.weight_decay, 0, 10);
  p.option("-b,--batch-size", "N", "windows of the text per step", s.batch, 1, 1 << 16);
  p.option("-c,--ctx-size", "N", "tokens per window", o.ctx, 1, 1 << 20);
  p.option("--seed", "S", "seed of the window order (a run is reproducible with it)", s.seed);
  p.option("--balance-weight", "X", "weight of the expert-group balance loss G * sum_g f_g * p_g at trained routers",
           s.balance_weight, 0, 1e6);
  p.option("--balance-groups", "G", "expert groups of the balance loss (must divide the expert count)",
           s.balance_groups, 1, 1 << 20, "one group per expert");
  p.option("--eval-windows", "N", "windows each evaluation covers at most", s.eval_windows, 1, INT64_MAX, "all");
  p.option("--patch-type", "T", "how the patch stores slices: base (the model tensor's type, re-quantized), f16 or f32",
           o.storage_name);
  add_threads_flag(p, o.n_threads);
  p.option("--exact",
           "forward products of quantized frozen weights on F32 activations (as eval --exact), not the engine's "
           "integer kernels (as eval and serve; several times faster)",
           o.exact);
  p.option("--json", "print one JSON object with the results to stdout", o.json);
  return p;
}

// The required flags, the groups to train and the patch's storage type (UsageError for a
// bad one).
patch::Storage resolve_finetune_options(const ArgParser& p, FinetuneOptions& o) {
  o.settings.precision = o.exact ? Precision::Exact : Precision::Native;
  for (const char* required : {"model", "file", "train", "out"})
    if (!p.has(required)) throw UsageError(std::string("--") + required + " is required");
  try {
    o.settings.groups = train::TrainGroups::parse(o.groups);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const std::string& name = o.storage_name;
  if (name != "base" && name != "f16" && name != "f32")
    throw UsageError("--patch-type expects base, f16 or f32, got '" + name + "'");
  return name == "f16" ? patch::Storage::F16 : name == "f32" ? patch::Storage::F32 : patch::Storage::BaseType;
}

// The training text's windows and the held-out text's (null without --eval-file).
struct TextWindows {
  std::unique_ptr<train::TokenWindows> train, held_out;
};

// Reads both texts (before the model is loaded: a wrong path fails at once), loads the
// model and cuts the texts into windows of its tokens.
std::unique_ptr<Model> load_model_and_texts(const FinetuneOptions& o, TextWindows& windows) {
  const std::string train_text = read_text(o.train_path, "--file");
  const std::string eval_text = o.eval_path.empty() ? "" : read_text(o.eval_path, "--eval-file");
  Model::LoadOptions lo;
  lo.verbose = false;
  lo.repack = false;  // training reads the file's rows, never the repacked copies
  std::unique_ptr<Model> model = Model::load(o.model_path, lo);
  const Tokenizer& tok = model->tokenizer();
  try {
    windows.train = std::make_unique<train::TokenWindows>(tok.encode(train_text, true, false), o.ctx);
    if (!o.eval_path.empty())
      windows.held_out = std::make_unique<train::TokenWindows>(tok.encode(eval_text, true, false), o.ctx);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  return model;
}

std::unique_ptr<train::Finetuner> make_finetuner(Model& model, const train::FinetuneSettings& s, ThreadPool& pool) {
  try {
    return std::make_unique<train::Finetuner>(model, s, pool);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

// The training and held-out losses at one point of the run (held_out: with --eval-file).
struct FinetuneLosses {
  train::Evaluation train;
  std::optional<train::Evaluation> held_out;
};

FinetuneLosses evaluate_losses(train::Finetuner& ft, const TextWindows& windows) {
  FinetuneLosses l;
  l.train = ft.evaluate(*windows.train);
  if (windows.held_out) l.held_out = ft.evaluate(*windows.held_out);
  return l;
}

// ", held-out loss X" when there is a held-out text.
std::string held_out_text(const FinetuneLosses& l) {
  return l.held_out ? ", held-out loss " + std::to_string(l.held_out->stats.loss()) : "";
}

// What a run did: the losses before and after training and the training's own figures.
struct FinetuneResult {
  FinetuneLosses before, after;
  train::TrainSummary summary;
};

// The trained slices in the patch's storage type; the trained values become the stored
// ones, so that the "after" figures are those of the patched model.
patch::Patch stored_patch(const Model& model, train::TrainedParams& params, patch::Storage storage) {
  patch::Patch out;
  out.base_name = model.file().opt_str("general.name").value_or("");
  for (train::TrainedTensor& t : params.tensors()) {
    out.slices.push_back(patch::make_slice(model, t.tensor, t.expert, t.value.data(), storage));
    t.value = patch::decode_slice(out.slices.back());
  }
  return out;
}

// The training's settings and losses, kept in the patch (step35 patch inspect shows them).
void record_training(patch::Patch& out, const FinetuneOptions& o, const std::string& groups, const FinetuneResult& r) {
  const train::FinetuneSettings& s = o.settings;
  const train::LossStats &before = r.before.train.stats, &after = r.after.train.stats;
  out.train_text = {{"groups", groups},
                    {"train_file", base_name(o.train_path)},
                    {"eval_file", o.eval_path.empty() ? "" : base_name(o.eval_path)},
                    {"storage", o.storage_name}};
  out.train_numbers = {{"steps", double(s.steps)},
                       {"lr", s.adamw.lr},
                       {"warmup", double(s.adamw.warmup_steps)},
                       {"clip", s.adamw.clip_norm},
                       {"weight_decay", s.adamw.weight_decay},
                       {"batch", double(s.batch)},
                       {"ctx", double(o.ctx)},
                       {"seed", double(s.seed)},
                       {"balance_weight", s.balance_weight},
                       {"balance_groups", double(s.balance_groups)},
                       {"train_loss_before", before.loss()},
                       {"train_loss_after", after.loss()}};
  if (before.n_routed) {
    out.train_numbers["routed_loss_before"] = before.routed_loss();
    out.train_numbers["routed_loss_after"] = after.routed_loss();
  }
  if (r.before.held_out) {
    out.train_numbers["eval_loss_before"] = r.before.held_out->stats.loss();
    out.train_numbers["eval_loss_after"] = r.after.held_out->stats.loss();
  }
}

void print_after_training(const FinetuneOptions& o, const FinetuneResult& r, const patch::Patch& out) {
  const train::Evaluation &before = r.before.train, &after = r.after.train;
  std::fprintf(stderr, "after:  train loss %.4f (routed %.4f)%s\n", after.stats.loss(), after.stats.routed_loss(),
               held_out_text(r.after).c_str());
  for (const auto& [layer, x] : before.skew)
    std::fprintf(stderr, "layer %d expert activation skew (max/mean): %.3f -> %.3f\n", layer, x,
                 after.skew.count(layer) ? after.skew.at(layer) : 0.0);
  std::fprintf(stderr, "wrote %s: %zu slices, %.2f MiB | %.0f training tokens/s | peak RSS %.1f MiB\n",
               o.out_path.c_str(), out.slices.size(), double(out.data_bytes()) / (1 << 20), r.summary.tokens_per_s,
               peak_rss_mib());
}

nlohmann::json results_json(const FinetuneOptions& o, const FinetuneResult& r, const patch::Patch& out,
                            train::Finetuner& ft) {
  const train::Evaluation &before = r.before.train, &after = r.after.train;
  const auto held_out_loss = [](const FinetuneLosses& l) {
    return l.held_out ? loss_or_null(l.held_out->stats, false) : nlohmann::json(nullptr);
  };
  nlohmann::json j;
  j["train_loss_before"] = loss_or_null(before.stats, false);
  j["train_loss_after"] = loss_or_null(after.stats, false);
  j["routed_loss_before"] = loss_or_null(before.stats, true);
  j["routed_loss_after"] = loss_or_null(after.stats, true);
  j["eval_loss_before"] = held_out_loss(r.before);
  j["eval_loss_after"] = held_out_loss(r.after);
  j["steps"] = r.summary.steps;
  j["tokens_per_s"] = r.summary.tokens_per_s;
  j["seconds"] = r.summary.seconds;
  j["train_tokens"] = before.stats.n_targets;
  j["routed_tokens"] = before.stats.n_routed;
  j["eval_tokens"] = r.before.held_out ? r.before.held_out->stats.n_targets : 0;
  j["groups"] = ft.groups().to_string();
  j["trained_values"] = ft.params().n_values();
  j["skew_before"] = skew_json(before.skew);
  j["skew_after"] = skew_json(after.skew);
  j["losses"] = r.summary.losses;
  j["patch"] = o.out_path;
  j["patch_bytes"] = out.data_bytes();
  j["peak_rss_mib"] = peak_rss_mib();
  j["activation_mib"] = double(ft.activation_bytes()) / (1 << 20);
  return j;
}

int finetune_main(const Args& args) {
  FinetuneOptions o;
  ArgParser p = finetune_parser(o);
  if (!p.parse(args)) return 0;
  const patch::Storage storage = resolve_finetune_options(p, o);
  TextWindows windows;
  const std::unique_ptr<Model> model = load_model_and_texts(o, windows);

  ThreadPool pool(o.n_threads);
  const std::unique_ptr<train::Finetuner> ft = make_finetuner(*model, o.settings, pool);
  ft->prepare(*windows.train);
  train::TrainedParams& params = ft->params();
  std::fprintf(stderr, "finetune: %s | train %s (%lld values, %.1f MiB in F32) | %lld training windows of %d tokens%s\n",
               o.model_path.c_str(), ft->groups().to_string().c_str(), static_cast<long long>(params.n_values()),
               double(params.n_values()) * 4 / (1 << 20), static_cast<long long>(windows.train->size()), o.ctx,
               windows.held_out ? (", " + std::to_string(windows.held_out->size()) + " held-out").c_str() : "");
  // Refuse an impossible storage type before spending time on training.
  for (const train::TrainedTensor& t : params.tensors())
    patch::make_slice(*model, t.tensor, t.expert, t.value.data(), storage);

  FinetuneResult r;
  r.before = evaluate_losses(*ft, windows);
  const train::LossStats& before = r.before.train.stats;
  std::fprintf(stderr, "before: train loss %.4f (routed %.4f over %lld tokens)%s\n", before.loss(),
               before.routed_loss(), static_cast<long long>(before.n_routed), held_out_text(r.before).c_str());
  Progress progress(o.settings.steps);
  r.summary = ft->train(*windows.train, [&](const train::StepInfo& si) { progress.update(si); });

  patch::Patch out = stored_patch(*model, params, storage);
  r.after = evaluate_losses(*ft, windows);
  record_training(out, o, ft->groups().to_string(), r);
  out.write(o.out_path);
  print_after_training(o, r, out);
  if (o.json) std::printf("%s\n", results_json(o, r, out, *ft).dump().c_str());
  return 0;
}

}  // namespace

int cmd_finetune(const Args& args) { return run_guarded("finetune", finetune_main, args); }

}  // namespace step35::cli
