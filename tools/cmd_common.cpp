#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <thread>

#include "args.h"
#include "common.h"
#include "engine/mtp_limits.h"
#include "tinymodel/make_tiny.h"
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

std::unique_ptr<Model> load_model(const std::string& path, bool quiet, const std::string& mtp_model,
                                  const ModelMemory& memory) {
  const double t0 = now_seconds();
  Model::LoadOptions opts;
  opts.verbose = !quiet;
  opts.progress = !quiet;
  opts.mtp_model = mtp_model;
  opts.mem_budget = memory.budget;
  opts.mem_kv_positions = memory.kv_positions;
  opts.mem_kv_types = memory.kv_types;
  std::unique_ptr<Model> model;
  try {
    model = Model::load(path, opts);
  } catch (const std::invalid_argument& e) {
    if (memory.budget == 0) throw;
    throw UsageError(e.what());  // the budget is too small: say so as the flag's error
  }
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
                 "model: %s | %d layers (%d SWA, %d full; %d MoE) + %d MTP%s | embd %d | vocab %d | "
                 "%.1f MiB of weights mapped%s | loaded in %.0f ms\n",
                 path.c_str(), hp.n_layer, n_swa, hp.n_layer - n_swa, n_moe, model->n_mtp_loaded(),
                 model->mtp_sidecar_path().empty() ? "" : (" (from " + model->mtp_sidecar_path() + ")").c_str(),
                 hp.n_embd, hp.n_vocab, double(model->weight_bytes()) / (1 << 20), repacked,
                 (now_seconds() - t0) * 1e3);
  }
  return model;
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw UsageError("cannot read " + path + ": " + std::strerror(errno));
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) bytes.insert(bytes.end(), buf, buf + n);
  const bool failed = std::ferror(f);
  std::fclose(f);
  if (failed) throw UsageError("cannot read " + path);
  return bytes;
}

void write_file_bytes(const std::string& path, const void* data, size_t n) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw UsageError("cannot write " + path + ": " + std::strerror(errno));
  const bool ok = std::fwrite(data, 1, n, f) == n;
  if (std::fclose(f) != 0 || !ok) throw UsageError("cannot write " + path);
}

void add_mem_budget_flag(ArgParser& p, std::string& size) {
  p.option("--mem-budget", "SIZE", "keep the process within SIZE of memory (e.g. 200M, 16G): dense weights mapped, "
           "routed experts read from the file into a cache of what is left (docs/memory.md)", size,
           "none: the file is mapped whole");
}

uint64_t parse_mem_size(const std::string& size) {
  if (size.empty()) return 0;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(size.c_str(), &end);
  std::string unit(end);
  for (const char* suffix : {"iB", "B"})
    if (unit.size() > std::strlen(suffix) && unit.compare(unit.size() - std::strlen(suffix), std::string::npos, suffix) == 0) {
      unit.resize(unit.size() - std::strlen(suffix));
      break;
    }
  const std::string units = "KMGT";
  double scale = 1;
  if (unit.size() == 1 && units.find(char(std::toupper(static_cast<unsigned char>(unit[0])))) != std::string::npos)
    scale = double(uint64_t(1) << (10 * (units.find(char(std::toupper(static_cast<unsigned char>(unit[0])))) + 1)));
  else if (!unit.empty())
    scale = 0;
  if (end == size.c_str() || errno != 0 || !(v >= 0) || scale == 0 || v * scale > 1e18)
    throw UsageError("--mem-budget: expected a size such as 200M, 3.5G or 16G, got '" + size + "'");
  return uint64_t(v * scale);
}

void add_mtp_model_flag(ArgParser& p, std::string& mtp_model) {
  p.option("--mtp-model", "FILE", "MTP sidecar: a GGUF holding only the MTP blocks, for a model file without them "
           "(Step-3.7-Flash's mtp-*.gguf); 'none': do not look for one", mtp_model,
           "an mtp-*.gguf beside the model, if the model has no MTP blocks");
}

void add_picture_flags(ArgParser& p, std::string& mmproj, std::vector<std::string>& images) {
  p.option("--mmproj", "FILE", "vision tower (a step3vl mmproj GGUF) for --image", mmproj);
  p.option("--image", "FILE", "picture (PNG, JPEG, BMP, GIF) for the next media marker <__media__> of the prompt "
           "(repeatable)", images);
}

vision::ImagePrompt picture_prompt(const Model& model, const std::string& mmproj, const std::vector<std::string>& files,
                                   const std::string& prompt, ThreadPool& pool, bool add_bos) {
  if (mmproj.empty()) throw UsageError("--image needs --mmproj (the model's vision tower)");
  std::unique_ptr<vision::Step3vlEncoder> encoder;
  try {
    encoder = vision::Step3vlEncoder::load(mmproj);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  std::vector<vision::RgbImage> pictures;
  for (const std::string& f : files) {
    const std::vector<uint8_t> bytes = read_file_bytes(f);
    try {
      pictures.push_back(vision::decode_image(bytes.data(), bytes.size()));
    } catch (const vision::ImageError& e) {
      throw UsageError(f + ": " + e.what());
    }
  }
  vision::ImagePrompt ip;
  try {
    ip = vision::build_image_prompt(prompt, pictures, *encoder, model.tokenizer(), model.hparams().n_embd, pool, add_bos);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  std::fprintf(stderr, "vision: %zu image%s, %zu chunks, %zu image tokens, encoded in %.1f ms\n", pictures.size(),
               pictures.size() == 1 ? "" : "s", ip.chunks.size(),
               ip.image_embeddings.size() / size_t(model.hparams().n_embd), ip.encode_ms);
  return ip;
}

void print_kv_cache(const KvCache& cache) { std::fprintf(stderr, "kv cache: %s\n", cache.describe().c_str()); }

void add_kv_cache_flags(ArgParser& p, KvTypes& types) {
  auto bind = [&p](const char* names, const char* flag, const char* help, DType& target) {
    p.option(names, "TYPE", help, [&target, flag](const std::string& v) {
      const std::optional<DType> parsed = kv_type_from_name(v);
      if (!parsed) throw UsageError(std::string(flag) + " expects f32, f16, bf16, q8_0 or q4_0, got '" + v + "'");
      target = *parsed;
    }, dtype_name(target));
  };
  bind("-ctk,--cache-type-k", "--cache-type-k", "KV cache type of keys: f32, f16, bf16, q8_0 or q4_0", types.k);
  bind("-ctv,--cache-type-v", "--cache-type-v", "KV cache type of values: f32, f16, bf16, q8_0 or q4_0", types.v);
}

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
    m.max_k = kMaxDrafts;
    m.adaptive = true;
    return m;
  }
  for (int32_t k = 0; k <= kMaxDrafts; ++k)
    if (value == std::to_string(k)) {
      m.max_k = k;
      return m;
    }
  throw UsageError("--mtp expects 0.." + std::to_string(kMaxDrafts) + " or auto, got '" + value + "'");
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

void add_sampling_flags(ArgParser& p, SamplingParams& sp) {
  p.option("--temp", "T", "temperature, 0 = greedy", sp.temperature, 0.0, 100.0);
  p.option("--top-k", "K", "keep the K most likely tokens, 0 = off", sp.top_k, 0, 1 << 30);
  p.option("--top-p", "P", "nucleus sampling threshold, 1 = off", sp.top_p, 0.0, 1.0);
  p.option("--min-p", "P", "drop tokens below P x the top probability, 0 = off", sp.min_p, 0.0, 1.0);
  p.option("--repeat-penalty", "X", "llama.cpp-style repetition penalty (divide positive logits, multiply negative "
           "ones, of recently seen tokens), 1 = off", sp.repeat_penalty, 0.0, 100.0);
  p.option("--repeat-last-n", "N", "how many recent tokens the penalties look at", sp.repeat_last_n, 0, 1 << 20);
  p.option("--presence-penalty", "X", "OpenAI presence penalty: subtract X from every token already seen",
           sp.presence_penalty, -100.0, 100.0);
  p.option("--frequency-penalty", "X", "OpenAI frequency penalty: subtract X times the count of each seen token",
           sp.frequency_penalty, -100.0, 100.0);
}

void add_threads_flag(ArgParser& p, int32_t& threads) {
  p.option("-t,--threads", "N", "worker threads", threads, 1, 1024, "number of cores");
}

void add_adaptive_policy_flags(ArgParser& p, float& mass, int32_t& min_k) {
  p.option("--adaptive-mass", "X", "adaptive policy: keep the top-ranked experts until their normalised router "
           "weights reach X", mass, 0.01, 1.0);
  p.option("--adaptive-min-k", "N", "adaptive policy: never fewer experts than N", min_k, 1, 1024);
}

bool adaptive_expert_policy(const std::string& value) {
  if (value != "strict" && value != "adaptive")
    throw UsageError("--expert-policy expects strict or adaptive, got '" + value + "'");
  return value == "adaptive";
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

void add_patch_flag(ArgParser& p, std::vector<std::string>& paths) {
  p.option("--patch", "FILE", "apply a patch file from step35 finetune (repeatable; later files win where they overlap)",
           paths);
}

void apply_patches(Model& model, const std::vector<std::string>& paths) {
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
