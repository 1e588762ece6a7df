#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "args.h"
#include "common.h"
#include "model/make_tiny.h"
#include "patch/patch.h"

namespace step35::cli {

int default_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::unique_ptr<Model> load_model(const std::string& path, bool quiet) {
  const double t0 = now_seconds();
  Model::LoadOptions opts;
  opts.verbose = !quiet;
  opts.progress = !quiet;
  auto model = Model::load(path, opts);
  if (!quiet) {
    const HParams& hp = model->hparams();
    int n_moe = 0, n_swa = 0;
    for (int il = 0; il < hp.n_layer; ++il) {
      n_moe += hp.layers[size_t(il)].is_moe;
      n_swa += hp.layers[size_t(il)].is_swa;
    }
    char repacked[128] = "";
    if (model->repacked_bytes() > 0 || model->lazy_repack_bytes() > 0)
      std::snprintf(repacked, sizeof repacked, ", %.1f MiB repacked%s", double(model->repacked_bytes()) / (1 << 20),
                    model->lazy_repack_bytes() > 0 ? " (experts: on first use)" : "");
    std::fprintf(stderr,
                 "model: %s | %d layers (%d SWA, %d full; %d MoE) + %d MTP | embd %d | vocab %d | "
                 "%.1f MiB of weights mapped%s | loaded in %.0f ms\n",
                 path.c_str(), hp.n_layer, n_swa, hp.n_layer - n_swa, n_moe, model->n_mtp_loaded(),
                 hp.n_embd, hp.n_vocab, double(model->weight_bytes()) / (1 << 20), repacked,
                 (now_seconds() - t0) * 1e3);
  }
  return model;
}

void print_kv_cache(const KvCache& cache) { std::fprintf(stderr, "kv cache: %s\n", cache.describe().c_str()); }

static std::string cache_dir() {
  if (const char* d = std::getenv("STEP35_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/step35";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/step35";
  return "/tmp/step35-cache";
}

static void mkdirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') ::mkdir(path.substr(0, i).c_str(), 0755);
}

std::string builtin_tiny_model_path() {
  const std::string dir = cache_dir();
  const std::string path = dir + "/tiny-random-v2-f32.gguf";
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return path;
  mkdirs(dir);
  std::fprintf(stderr, "creating the built-in tiny model at %s ...\n", path.c_str());
  // Write to a temporary name, then rename: a concurrent or interrupted run never sees a
  // half-written file.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  TinyModelOptions opts;
  opts.name = "step35-tiny-random";
  make_tiny_model(opts, tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot create " + path);
  }
  return path;
}

MtpSetting parse_mtp_value(const std::string& value) {
  MtpSetting m;
  if (value == "auto") {
    m.max_k = 3;
    m.adaptive = true;
  } else if (value.size() == 1 && value[0] >= '0' && value[0] <= '3') {
    m.max_k = value[0] - '0';
  } else {
    throw UsageError("--mtp expects 0, 1, 2, 3 or auto, got '" + value + "'");
  }
  return m;
}

MtpSetting parse_mtp(const std::string& value, const Model& model) {
  MtpSetting m = parse_mtp_value(value);
  if (m.max_k > 0 && !model.has_mtp()) {
    if (!m.adaptive) throw UsageError("--mtp " + value + ": this model has no MTP blocks (nextn tensors)");
    m.max_k = 0;
    m.adaptive = false;
  }
  return m;
}

void add_adaptive_policy_flags(ArgParser& p) {
  p.flag("--adaptive-mass", "X", "adaptive policy: keep top experts until their normalised weights reach X", "0.9");
  p.flag("--adaptive-min-k", "N", "adaptive policy: never fewer experts than N", "4");
}

ExpertPolicySetting parse_expert_policy(const ArgParser& p) {
  ExpertPolicySetting e;
  const std::string policy = p.str("expert-policy", "strict");
  if (policy != "strict" && policy != "adaptive")
    throw UsageError("--expert-policy expects strict or adaptive, got '" + policy + "'");
  e.adaptive = policy == "adaptive";
  e.mass = float(p.f64("adaptive-mass", 0.9, 0.01, 1.0));
  e.min_k = int32_t(p.i64("adaptive-min-k", 4, 1, 1024));
  return e;
}

std::vector<int32_t> parse_token_list(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > 0x7fffffff)
      throw UsageError("--tokens expects comma-separated non-negative token ids, got '" + item + "'");
    ids.push_back(int32_t(v));
    i = j + 1;
  }
  if (ids.empty()) throw UsageError("--tokens is empty");
  return ids;
}

void add_patch_flag(ArgParser& p) {
  p.flag("--patch", "FILE", "apply a patch file from step35 finetune (repeatable; later files win where they overlap)");
}

void apply_patch_flags(Model& model, const ArgParser& p) {
  const std::vector<std::string> paths = p.all("patch");
  if (paths.empty()) return;
  try {
    const auto patches = patch::load_and_apply(model, paths);
    uint64_t bytes = 0;
    size_t slices = 0;
    for (const auto& pt : patches) {
      bytes += pt->data_bytes();
      slices += pt->slices.size();
    }
    std::fprintf(stderr, "patches: %zu file%s, %zu slices (%.2f MiB) applied\n", patches.size(),
                 patches.size() == 1 ? "" : "s", slices, double(bytes) / (1 << 20));
  } catch (const patch::PatchError& e) {
    throw UsageError(std::string("--patch: ") + e.what());
  } catch (const gguf::Error& e) {
    throw UsageError(std::string("--patch: ") + e.what());
  }
}

}  // namespace step35::cli
