// step35 model: hyperparameters, tensors and the forward pass as docs/architecture.md
// describes them ("Hyperparameters", "GGUF: keys and tensors", "The model").
#include "model/step35.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <numeric>
#include <stdexcept>

#include "exec/thread_pool.h"
#include "tensor/quants.h"

namespace step35 {

namespace {

std::string key(const char* k) { return std::string("step35.") + k; }

std::string shape_str(const int64_t* ne, uint32_t n) {
  std::string s = "{";
  for (uint32_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

}  // namespace

std::string block_tensor_name(int layer, const char* name) {
  return "blk." + std::to_string(layer) + "." + name;
}

// ---------------------------------------------------------------------------------------
// Loading

namespace {

// What llama.cpp recognises an MTP sidecar by: MTP blocks declared, no trunk layer 0.
bool is_mtp_sidecar(const gguf::File& f) {
  return f.opt_u32(key("nextn_predict_layers")).value_or(0) > 0 && !f.find_tensor("blk.0.attn_norm.weight");
}

// The number of trunk layers a file declares (block_count minus the MTP blocks), 0 if unknown.
int64_t declared_trunk_layers(const gguf::File& f) {
  const auto blocks = f.opt_u32(key("block_count"));
  return blocks ? int64_t(*blocks) - int64_t(f.opt_u32(key("nextn_predict_layers")).value_or(0)) : 0;
}

// Whether the main file holds MTP blocks of its own (their tensors, not only the key).
bool holds_mtp_blocks(const gguf::File& f) {
  return f.find_tensor(block_tensor_name(int(declared_trunk_layers(f)), "nextn.eh_proj.weight")) != nullptr;
}

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Why a sidecar candidate cannot serve `main` in a quick look at its header ("" if it can);
// Model::adopt_mtp_sidecar_hparams checks the rest.
std::string sidecar_misfit(const gguf::File& main, const gguf::File& side) {
  if (side.opt_str("general.architecture").value_or("") != "step35") return "its architecture is not step35";
  if (!is_mtp_sidecar(side)) return "it is not an MTP sidecar (no nextn_predict_layers, or it holds trunk layers)";
  const int64_t main_layers = declared_trunk_layers(main), side_layers = declared_trunk_layers(side);
  if (main_layers != side_layers)
    return "its MTP blocks start at block " + std::to_string(side_layers) + ", the model has " +
           std::to_string(main_layers) + " layers";
  const auto main_embd = main.opt_u32(key("embedding_length")), side_embd = side.opt_u32(key("embedding_length"));
  if (main_embd != side_embd)
    return "its embedding length is " + std::to_string(side_embd.value_or(0)) + ", the model's " +
           std::to_string(main_embd.value_or(0));
  const gguf::TensorInfo* main_te = main.find_tensor("token_embd.weight");
  const gguf::TensorInfo* side_te = side.find_tensor("token_embd.weight");
  if (main_te && side_te && main_te->ne[1] != side_te->ne[1])
    return "its vocabulary has " + std::to_string(side_te->ne[1]) + " tokens, the model's " +
           std::to_string(main_te->ne[1]);
  return "";
}

// The sidecar for `main` (opened), or nullptr: the one named, or with an empty name an
// mtp-*.gguf beside the model when the model has no MTP block. Several candidates that fit:
// the one whose name (after "mtp-") shares the longest prefix with the model's.
std::unique_ptr<gguf::File> open_mtp_sidecar(const gguf::File& main, const std::string& model_path,
                                             const Model::LoadOptions& opts) {
  if (opts.mtp_model == Model::kNoMtpSidecar) return nullptr;
  if (!opts.mtp_model.empty()) {
    if (holds_mtp_blocks(main))
      throw gguf::Error(model_path + " holds MTP blocks of its own; --mtp-model " + opts.mtp_model +
                        " is for a model file without them");
    auto side = gguf::File::open(opts.mtp_model);
    if (const std::string why = sidecar_misfit(main, *side); !why.empty())
      throw gguf::Error(opts.mtp_model + " does not fit " + model_path + " as its MTP sidecar: " + why);
    return side;
  }
  if (holds_mtp_blocks(main)) return nullptr;
  std::vector<std::string> names;
  if (DIR* d = ::opendir(folder_of(model_path).c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 9 && n.rfind("mtp-", 0) == 0 && n.compare(n.size() - 5, 5, ".gguf") == 0) names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  std::unique_ptr<gguf::File> best;
  std::string best_name, refusals;
  size_t best_prefix = 0;
  const std::string model_name = base_name(model_path);
  for (const std::string& n : names) {
    const std::string path = model_path.find('/') == std::string::npos ? n : folder_of(model_path) + "/" + n;
    std::unique_ptr<gguf::File> side;
    std::string why;
    try {
      side = gguf::File::open(path);
      why = sidecar_misfit(main, *side);
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!why.empty()) {
      refusals += "\n  " + path + ": " + why;
      continue;
    }
    size_t prefix = 0;
    while (prefix + 4 < n.size() && prefix < model_name.size() && n[prefix + 4] == model_name[prefix]) ++prefix;
    if (!best || prefix > best_prefix) best = std::move(side), best_name = path, best_prefix = prefix;
  }
  if (!best && !refusals.empty())
    throw gguf::Error("the MTP sidecar beside " + model_path + " does not fit it (pass --mtp-model FILE, or " +
                      "--mtp-model none to run without MTP):" + refusals);
  if (best && opts.verbose)
    std::fprintf(stderr, "mtp: using the MTP sidecar %s found beside the model (--mtp-model none: without it)\n",
                 best_name.c_str());
  return best;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& opts) {
  auto file = gguf::File::open(path);
  if (is_mtp_sidecar(*file))
    throw gguf::Error(path + " is an MTP sidecar (it holds only the MTP blocks): pass the main model file with -m "
                      "and this one with --mtp-model");
  auto side = open_mtp_sidecar(*file, path, opts);
  return load_parsed(std::move(file), std::move(side), opts);
}

namespace {

// Physical memory, or the cgroup (v2) limit of this process when that is lower.
uint64_t usable_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t bytes = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
  if (FILE* f = std::fopen("/sys/fs/cgroup/memory.max", "r")) {
    unsigned long long limit = 0;
    if (std::fscanf(f, "%llu", &limit) == 1 && limit > 0 && (bytes == 0 || limit < bytes)) bytes = limit;
    std::fclose(f);
  }
  return bytes;
}

}  // namespace

std::unique_ptr<Model> Model::load_buffer(const uint8_t* data, size_t size, const std::string& name,
                                          const LoadOptions& opts) {
  return load_parsed(gguf::File::parse_buffer(data, size, name), nullptr, opts);
}

std::unique_ptr<Model> Model::load_parsed(std::unique_ptr<gguf::File> file, std::unique_ptr<gguf::File> mtp_file,
                                          const LoadOptions& opts) {
  const std::string path = file->path();
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  m->mtp_file_ = std::move(mtp_file);
  m->load_hparams();
  if (m->mtp_file_) m->adopt_mtp_sidecar_hparams();
  m->tokenizer_ = Tokenizer::from_gguf(*m->file_);
  m->load_tensors(opts);
  bool repack = opts.repack;
  LoadOptions::ExpertRepack experts = opts.repack_experts;
  if (const char* env = std::getenv("STEP35_REPACK"); env && *env) {
    const std::string v(env);
    if (v != "0" && v != "shared" && v != "lazy" && v != "all")
      throw std::invalid_argument("STEP35_REPACK: expected 0, shared, lazy or all, got '" + v + "'");
    repack = v != "0";
    experts = v == "all"    ? LoadOptions::ExpertRepack::AtLoad
              : v == "lazy" ? LoadOptions::ExpertRepack::OnFirstUse
                            : LoadOptions::ExpertRepack::Never;
  }
  if (experts == LoadOptions::ExpertRepack::Auto)
    experts = m->weight_bytes_ + m->repack_growth_bytes() <= usable_memory_bytes() / 4 * 3
                  ? LoadOptions::ExpertRepack::OnFirstUse
                  : LoadOptions::ExpertRepack::Never;
  if (opts.mem_budget > 0) experts = LoadOptions::ExpertRepack::Never;  // the cache holds file rows
  if (repack) m->repack_weights(experts);
  if (opts.mem_budget > 0) m->start_expert_cache(opts);
  auto base = std::make_shared<WeightSet>();
  base->layers = m->layers_;
  m->weights_ = std::move(base);
  if (int64_t(m->tokenizer_->n_vocab()) > m->hp_.n_vocab)
    throw gguf::Error(path + ": tokenizer has " + std::to_string(m->tokenizer_->n_vocab()) +
                      " tokens but token_embd.weight only " + std::to_string(m->hp_.n_vocab) +
                      " rows");
  return m;
}

namespace {

// A count key's value, checked to lie in 1 .. 2^30.
int32_t checked_count(const gguf::File& f, const std::string& k, int64_t v) {
  if (v <= 0 || v > (int64_t(1) << 30))
    throw gguf::Error(f.path() + ": key '" + k + "' = " + std::to_string(v) + " is out of range (expected 1 .. 2^30)");
  return int32_t(v);
}

// The hyperparameters shared by all layers; `layers` stays empty.
HParams read_model_hparams(const gguf::File& f) {
  const std::string& path = f.path();
  HParams hp;
  hp.n_embd = checked_count(f, key("embedding_length"), f.get_u32(key("embedding_length")));
  const int32_t n_block = checked_count(f, key("block_count"), f.get_u32(key("block_count")));
  hp.n_mtp = int32_t(f.opt_u32(key("nextn_predict_layers")).value_or(0));
  if (hp.n_mtp >= n_block)
    throw gguf::Error(path + ": key '" + key("nextn_predict_layers") + "' = " +
                      std::to_string(hp.n_mtp) + " (expected less than block_count " +
                      std::to_string(n_block) + ")");
  hp.n_layer = n_block - hp.n_mtp;
  hp.head_dim_k = checked_count(f, key("attention.key_length"), f.get_u32(key("attention.key_length")));
  hp.head_dim_v = checked_count(f, key("attention.value_length"),
                                f.opt_u32(key("attention.value_length")).value_or(uint32_t(hp.head_dim_k)));
  hp.rms_eps = f.get_f32(key("attention.layer_norm_rms_epsilon"));
  if (!(hp.rms_eps > 0.0f) || !std::isfinite(hp.rms_eps))
    throw gguf::Error(path + ": key '" + key("attention.layer_norm_rms_epsilon") +
                      "' must be a positive number");
  hp.swa_window = checked_count(f, key("attention.sliding_window"), f.get_u32(key("attention.sliding_window")));
  hp.n_ctx_train = int32_t(std::min<uint64_t>(f.opt_u32(key("context_length")).value_or(4096), 1u << 30));
  hp.n_expert = int32_t(f.opt_u32(key("expert_count")).value_or(0));
  hp.n_ff_shexp = int32_t(f.opt_u32(key("expert_shared_feed_forward_length")).value_or(0));
  // 1 = softmax, 2 = sigmoid; step35 uses sigmoid when the key is absent or 0.
  const uint32_t gating = f.opt_u32(key("expert_gating_func")).value_or(0);
  if (gating > 2)
    throw gguf::Error(path + ": key '" + key("expert_gating_func") + "' = " + std::to_string(gating) +
                      " (expected 1 softmax or 2 sigmoid)");
  hp.gating_sigmoid = gating != 1;
  hp.expert_weights_norm = f.opt_bool(key("expert_weights_norm")).value_or(false);
  hp.expert_weights_scale = f.opt_f32(key("expert_weights_scale")).value_or(1.0f);
  if (hp.expert_weights_scale == 0.0f) hp.expert_weights_scale = 1.0f;  // 0 = unset
  return hp;
}

// A MoE layer needs the expert counts and sizes.
void check_moe_layer(const HParams& hp, const LayerHParams& L, const std::string& where) {
  if (hp.n_expert <= 0)
    throw gguf::Error(where + "MoE layer but key '" + key("expert_count") + "' is missing or 0");
  if (L.n_expert_used <= 0 || L.n_expert_used > hp.n_expert)
    throw gguf::Error(where + "expert_used_count " + std::to_string(L.n_expert_used) +
                      " (expected 1 .. expert_count " + std::to_string(hp.n_expert) + ")");
  if (L.n_ff_exp <= 0)
    throw gguf::Error(where + "key '" + key("expert_feed_forward_length") + "' is missing or 0");
}

// Every block's hyperparameters (the per-layer keys: arrays, or one value for all layers).
std::vector<LayerHParams> read_layer_hparams(const gguf::File& f, const HParams& hp) {
  const size_t n = size_t(hp.n_layer + hp.n_mtp);
  const auto is_swa = f.get_bool_per_layer(key("attention.sliding_window_pattern"), n);
  const auto n_head = f.get_u32_per_layer(key("attention.head_count"), n);
  const auto n_head_kv = f.get_u32_per_layer(key("attention.head_count_kv"), n);
  const auto n_ff = f.get_u32_per_layer(key("feed_forward_length"), n, 0u);
  const auto n_used = f.get_u32_per_layer(key("expert_used_count"), n, 0u);
  const auto n_ff_exp = f.get_u32_per_layer(key("expert_feed_forward_length"), n, 0u);
  const auto clamp_exp = f.get_f32_per_layer(key("swiglu_clamp_exp"), n, 0.0f);
  const auto clamp_shexp = f.get_f32_per_layer(key("swiglu_clamp_shexp"), n, 0.0f);
  // architecture.md "Per-layer schedule": SWA rotary dims = rope.dimension_count (default
  // key_length), optionally overridden by dimension_count_swa; full layers rotate half of
  // rope.dimension_count.
  const uint32_t rot = f.opt_u32(key("rope.dimension_count")).value_or(uint32_t(hp.head_dim_k));
  const uint32_t rot_swa = f.opt_u32(key("rope.dimension_count_swa")).value_or(rot);
  const float base = f.opt_f32(key("rope.freq_base")).value_or(10000.0f);
  const float base_swa = f.opt_f32(key("rope.freq_base_swa")).value_or(10000.0f);
  const bool has_rope_freqs = f.find_tensor("rope_freqs.weight") != nullptr;

  std::vector<LayerHParams> layers(n);
  for (size_t il = 0; il < n; ++il) {
    LayerHParams& L = layers[il];
    const std::string where = f.path() + ": layer " + std::to_string(il) + ": ";
    L.is_swa = is_swa[il];
    L.n_head = checked_count(f, key("attention.head_count"), n_head[il]);
    L.n_head_kv = checked_count(f, key("attention.head_count_kv"), n_head_kv[il]);
    if (L.n_head % L.n_head_kv != 0)
      throw gguf::Error(where + "head_count " + std::to_string(L.n_head) +
                        " is not a multiple of head_count_kv " + std::to_string(L.n_head_kv));
    L.n_rot = int32_t(L.is_swa ? rot_swa : rot / 2);
    if (L.n_rot % 2 != 0 || L.n_rot > hp.head_dim_k)
      throw gguf::Error(where + "rotary dims " + std::to_string(L.n_rot) +
                        " (expected an even number <= key_length " + std::to_string(hp.head_dim_k) + ")");
    L.rope_base = L.is_swa ? base_swa : base;
    L.use_rope_freqs = !L.is_swa && has_rope_freqs;
    L.is_moe = f.find_tensor(block_tensor_name(int(il), "ffn_gate_inp.weight")) != nullptr;
    L.n_ff = int32_t(n_ff[il]);
    L.n_expert_used = int32_t(n_used[il]);
    L.n_ff_exp = int32_t(n_ff_exp[il]);
    L.clamp_exp = clamp_exp[il];
    L.clamp_shexp = clamp_shexp[il];
    if (L.is_moe) check_moe_layer(hp, L, where);
  }
  return layers;
}

// The hyperparameters a file declares (architecture.md "Hyperparameters").
HParams read_hparams(const gguf::File& f) {
  const std::string arch = f.get_str("general.architecture");
  if (arch != "step35")
    throw gguf::Error(f.path() + ": general.architecture is '" + arch + "' (expected 'step35')");
  HParams hp = read_model_hparams(f);
  hp.layers = read_layer_hparams(f, hp);
  return hp;
}

}  // namespace

void Model::load_hparams() { hp_ = read_hparams(*file_); }

void Model::adopt_mtp_sidecar_hparams() {
  const HParams side = read_hparams(*mtp_file_);
  const std::string fits = mtp_file_->path() + " does not fit " + file_->path() + " as its MTP sidecar: ";
  auto differ = [&](const char* what, double a, double b) {
    if (a != b)
      throw gguf::Error(fits + what + " is " + std::to_string(b) + " there and " + std::to_string(a) + " in the model");
  };
  differ("the number of trunk layers", hp_.n_layer, side.n_layer);
  differ("embedding_length", hp_.n_embd, side.n_embd);
  differ("attention.key_length", hp_.head_dim_k, side.head_dim_k);
  differ("attention.value_length", hp_.head_dim_v, side.head_dim_v);
  differ("attention.layer_norm_rms_epsilon", hp_.rms_eps, side.rms_eps);
  differ("attention.sliding_window", hp_.swa_window, side.swa_window);
  differ("expert_count", hp_.n_expert, side.n_expert);
  differ("expert_gating_func (sigmoid)", hp_.gating_sigmoid, side.gating_sigmoid);
  differ("expert_weights_norm", hp_.expert_weights_norm, side.expert_weights_norm);
  differ("expert_weights_scale", hp_.expert_weights_scale, side.expert_weights_scale);
  for (int32_t il = 0; il < hp_.n_layer; ++il) {
    const LayerHParams &a = hp_.layers[size_t(il)], &b = side.layers[size_t(il)];
    if (a.is_swa != b.is_swa || a.n_head != b.n_head || a.n_head_kv != b.n_head_kv || a.n_rot != b.n_rot)
      throw gguf::Error(fits + "layer " + std::to_string(il) + " has another attention shape there");
  }
  hp_.n_mtp = side.n_mtp;
  hp_.layers.insert(hp_.layers.end(), side.layers.begin() + hp_.n_layer, side.layers.end());
  mtp_sidecar_path_ = mtp_file_->path();
}

namespace {

// Binds the tensors of a file (the model's, or the MTP sidecar's) to weight views: looks
// each up, checks its shape, counts its bytes and draws the progress bar.
class TensorBinder {
 public:
  TensorBinder(const gguf::File& from, size_t n_total, bool show_progress, uint64_t& weight_bytes)
      : from_(&from), n_total_(n_total), show_progress_(show_progress), weight_bytes_(weight_bytes) {}

  void read_from(const gguf::File& f) { from_ = &f; }
  const gguf::File& file() const { return *from_; }

  // A view of the tensor (absent + optional -> empty).
  WeightMatrix matrix(const std::string& name, std::vector<int64_t> shape, bool required) {
    const gguf::TensorInfo* t = from_->find_tensor(name);
    if (!t) {
      if (required) throw gguf::Error(from_->path() + ": missing tensor '" + name + "'");
      return {};
    }
    bool ok = t->n_dims >= 1;
    for (size_t d = 0; d < 4 && ok; ++d) {
      const int64_t want = d < shape.size() ? shape[d] : 1;
      if (t->ne[d] != want) ok = false;
    }
    if (!ok)
      throw gguf::Error(from_->path() + ": tensor '" + name + "' has shape " + shape_str(t->ne, t->n_dims) +
                        " (expected " + shape_str(shape.data(), uint32_t(shape.size())) + ")");
    WeightMatrix w;
    w.data = t->data;
    w.type = DType(t->type);
    w.n_in = t->ne[0];
    w.n_out = t->ne[1];
    w.n_mat = t->ne[2];
    w.row_bytes = *row_bytes(w.type, w.n_in);
    weight_bytes_ += t->nbytes;
    ++n_bound_;
    if (show_progress_ && (n_bound_ % 16 == 0 || n_bound_ == n_total_)) {
      const int width = 40, done = int(width * n_bound_ / std::max<size_t>(n_total_, 1));
      std::fprintf(stderr, "\rloading [%.*s%*s] %zu/%zu tensors", done,
                   "========================================", width - done, "", n_bound_, n_total_);
    }
    return w;
  }

  // A vector tensor converted to F32 (absent + optional -> empty).
  std::vector<float> vec(const std::string& name, int64_t n, bool required) {
    WeightMatrix w = matrix(name, {n}, required);
    std::vector<float> v;
    if (!w.present()) return v;
    v.resize(size_t(n));
    dequantize_row_ref(w.type, w.data, v.data(), n);
    return v;
  }

  void end_progress() const {
    if (show_progress_) std::fprintf(stderr, "\n");
  }

 private:
  const gguf::File* from_;
  size_t n_bound_ = 0;
  size_t n_total_;
  bool show_progress_;
  uint64_t& weight_bytes_;
};

// The converter writes rope_freqs into the sidecar too (its full-attention MTP block uses
// it): the model's copy, else the sidecar's; empty when neither has one.
std::vector<float> bind_rope_freqs(TensorBinder& bind, const gguf::File& model, const gguf::File* sidecar,
                                   const HParams& hp) {
  std::vector<float> freqs;
  for (const gguf::File* g : {&model, sidecar}) {
    const gguf::TensorInfo* rf = g ? g->find_tensor("rope_freqs.weight") : nullptr;
    if (!rf || !freqs.empty()) continue;
    const int64_t n_rf = rf->ne[0];
    int32_t max_half = 0;
    for (const auto& L : hp.layers)
      if (L.use_rope_freqs) max_half = std::max(max_half, L.n_rot / 2);
    if (n_rf < max_half)
      throw gguf::Error(g->path() + ": tensor 'rope_freqs.weight' has " + std::to_string(n_rf) +
                        " entries (expected at least " + std::to_string(max_half) + ")");
    bind.read_from(*g);
    freqs = bind.vec("rope_freqs.weight", n_rf, true);
    bind.read_from(model);
  }
  return freqs;
}

void bind_attention(TensorBinder& bind, const HParams& hp, int il, LayerWeights& W) {
  const LayerHParams& L = hp.layers[size_t(il)];
  const int64_t E = hp.n_embd, D = hp.head_dim_k, Dv = hp.head_dim_v, H = L.n_head, G = L.n_head_kv;
  W.attn_norm = bind.vec(block_tensor_name(il, "attn_norm.weight"), E, true);
  if (bind.file().find_tensor(block_tensor_name(il, "attn_qkv.weight"))) {
    // Fused Q‖K‖V: three consecutive row ranges of one matrix.
    WeightMatrix qkv = bind.matrix(block_tensor_name(il, "attn_qkv.weight"), {E, H * D + G * D + G * Dv}, true);
    W.attn_q = qkv, W.attn_q.n_out = H * D;
    W.attn_k = qkv, W.attn_k.n_out = G * D, W.attn_k.data = qkv.row(H * D);
    W.attn_v = qkv, W.attn_v.n_out = G * Dv, W.attn_v.data = qkv.row(H * D + G * D);
  } else {
    W.attn_q = bind.matrix(block_tensor_name(il, "attn_q.weight"), {E, H * D}, true);
    W.attn_k = bind.matrix(block_tensor_name(il, "attn_k.weight"), {E, G * D}, true);
    W.attn_v = bind.matrix(block_tensor_name(il, "attn_v.weight"), {E, G * Dv}, true);
  }
  W.attn_q_norm = bind.vec(block_tensor_name(il, "attn_q_norm.weight"), D, false);
  W.attn_k_norm = bind.vec(block_tensor_name(il, "attn_k_norm.weight"), D, false);
  W.attn_gate = bind.matrix(block_tensor_name(il, "attn_gate.weight"), {E, H}, false);
  W.attn_output = bind.matrix(block_tensor_name(il, "attn_output.weight"), {H * Dv, E}, true);
}

void bind_moe(TensorBinder& bind, const HParams& hp, int il, LayerWeights& W) {
  const int64_t E = hp.n_embd, X = hp.n_expert, F = hp.layers[size_t(il)].n_ff_exp;
  W.ffn_gate_inp = bind.matrix(block_tensor_name(il, "ffn_gate_inp.weight"), {E, X}, true);
  W.exp_probs_b = bind.vec(block_tensor_name(il, "exp_probs_b.bias"), X, false);
  W.ffn_gate_exps = bind.matrix(block_tensor_name(il, "ffn_gate_exps.weight"), {E, F, X}, true);
  W.ffn_up_exps = bind.matrix(block_tensor_name(il, "ffn_up_exps.weight"), {E, F, X}, true);
  W.ffn_down_exps = bind.matrix(block_tensor_name(il, "ffn_down_exps.weight"), {F, E, X}, true);
  if (const gguf::TensorInfo* sh = bind.file().find_tensor(block_tensor_name(il, "ffn_up_shexp.weight"))) {
    const int64_t FS = hp.n_ff_shexp > 0 ? hp.n_ff_shexp : sh->ne[1];
    W.ffn_gate_shexp = bind.matrix(block_tensor_name(il, "ffn_gate_shexp.weight"), {E, FS}, true);
    W.ffn_up_shexp = bind.matrix(block_tensor_name(il, "ffn_up_shexp.weight"), {E, FS}, true);
    W.ffn_down_shexp = bind.matrix(block_tensor_name(il, "ffn_down_shexp.weight"), {FS, E}, true);
  }
}

void bind_dense(TensorBinder& bind, const HParams& hp, int il, const std::string& model_path, LayerWeights& W) {
  const LayerHParams& L = hp.layers[size_t(il)];
  const int64_t E = hp.n_embd;
  if (L.n_ff <= 0)
    throw gguf::Error(model_path + ": layer " + std::to_string(il) + ": dense layer but key '" +
                      key("feed_forward_length") + "' is missing or 0");
  W.ffn_gate = bind.matrix(block_tensor_name(il, "ffn_gate.weight"), {E, L.n_ff}, true);
  W.ffn_up = bind.matrix(block_tensor_name(il, "ffn_up.weight"), {E, L.n_ff}, true);
  W.ffn_down = bind.matrix(block_tensor_name(il, "ffn_down.weight"), {L.n_ff, E}, true);
}

void bind_mtp_head(TensorBinder& bind, const HParams& hp, int il, LayerWeights& W) {
  const int64_t E = hp.n_embd, V = hp.n_vocab;
  W.nextn_eh_proj = bind.matrix(block_tensor_name(il, "nextn.eh_proj.weight"), {2 * E, E}, true);
  W.nextn_enorm = bind.vec(block_tensor_name(il, "nextn.enorm.weight"), E, true);
  W.nextn_hnorm = bind.vec(block_tensor_name(il, "nextn.hnorm.weight"), E, true);
  W.nextn_shared_head_norm = bind.vec(block_tensor_name(il, "nextn.shared_head_norm.weight"), E, false);
  W.nextn_shared_head_head = bind.matrix(block_tensor_name(il, "nextn.shared_head_head.weight"), {E, V}, false);
  W.nextn_embed_tokens = bind.matrix(block_tensor_name(il, "nextn.embed_tokens.weight"), {E, V}, false);
}

// The sidecar's copies of the embedding and output must be the model's (shape and type;
// the bytes are not read: on a released model they are gigabytes).
void check_sidecar_shares_head(const gguf::File& model, const gguf::File& sidecar) {
  for (const char* name : {"token_embd.weight", "output.weight"}) {
    const gguf::TensorInfo *a = model.find_tensor(name), *b = sidecar.find_tensor(name);
    if (a && b && (a->type != b->type || a->ne[0] != b->ne[0] || a->ne[1] != b->ne[1]))
      throw gguf::Error(sidecar.path() + " does not fit " + model.path() + " as its MTP sidecar: tensor '" + name +
                        "' has another type or shape there");
  }
}

}  // namespace

void Model::load_tensors(const LoadOptions& opts) {
  const gguf::File& f = *file_;
  const std::string& path = f.path();
  const size_t n_total = f.tensors().size() + (mtp_file_ ? mtp_file_->tensors().size() : 0);
  TensorBinder bind(f, n_total, opts.progress && isatty(2), weight_bytes_);

  const gguf::TensorInfo* te = f.find_tensor("token_embd.weight");
  if (!te) throw gguf::Error(path + ": missing tensor 'token_embd.weight'");
  if (te->ne[1] <= 0 || te->ne[1] > (int64_t(1) << 31) - 1)
    throw gguf::Error(path + ": tensor 'token_embd.weight' has an invalid vocabulary size");
  hp_.n_vocab = int32_t(te->ne[1]);
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  token_embd_ = bind.matrix("token_embd.weight", {E, V}, true);
  output_norm_ = bind.vec("output_norm.weight", E, true);
  output_ = bind.matrix("output.weight", {E, V}, true);
  rope_freqs_ = bind_rope_freqs(bind, f, mtp_file_.get(), hp_);

  // The blocks; the MTP blocks from the sidecar when there is one.
  layers_.resize(hp_.layers.size());
  for (int il = 0; il < int(hp_.layers.size()); ++il) {
    LayerWeights& W = layers_[size_t(il)];
    const bool is_mtp = il >= hp_.n_layer;
    if (is_mtp && mtp_file_) bind.read_from(*mtp_file_);
    if (is_mtp && !bind.file().find_tensor(block_tensor_name(il, "nextn.eh_proj.weight")))
      continue;  // MTP tensors absent
    bind_attention(bind, hp_, il, W);
    W.ffn_norm = bind.vec(block_tensor_name(il, "ffn_norm.weight"), E, true);
    if (hp_.layers[size_t(il)].is_moe)
      bind_moe(bind, hp_, il, W);
    else
      bind_dense(bind, hp_, il, path, W);
    if (is_mtp) {
      bind_mtp_head(bind, hp_, il, W);
      ++n_mtp_loaded_;
    }
  }
  if (mtp_file_ && n_mtp_loaded_ == 0)
    throw gguf::Error(mtp_file_->path() + ": MTP sidecar without MTP block tensors (blk." +
                      std::to_string(hp_.n_layer) + ".nextn.eh_proj.weight)");
  if (mtp_file_) check_sidecar_shares_head(f, *mtp_file_);
  bind.end_progress();
}

std::vector<KvLayerShape> Model::kv_layers(bool with_mtp) const {
  std::vector<KvLayerShape> shapes;
  const int32_t n = hp_.n_layer + (with_mtp ? n_mtp_loaded_ : 0);
  for (int32_t il = 0; il < n; ++il) {
    const LayerHParams& L = hp_.layers[size_t(il)];
    shapes.push_back({L.is_swa, L.n_head_kv, hp_.head_dim_k, hp_.head_dim_v});
  }
  return shapes;
}

void Model::release_pages(const void* p, size_t n) const {
  file_->release_pages(p, n);
  if (mtp_file_) mtp_file_->release_pages(p, n);
}

uint64_t Model::repack_growth_bytes() const {
  uint64_t grow = 0;
  auto add = [&](const WeightMatrix& w) {
    if (!kernels::can_repack(w)) return;
    const uint64_t copy = kernels::repacked_bytes(w), rows = w.total_bytes();
    if (copy > rows) grow += copy - rows;
  };
  for (const LayerWeights& W : layers_)
    for (const WeightMatrix* w : {&W.attn_q, &W.attn_k, &W.attn_v, &W.attn_gate, &W.attn_output, &W.ffn_gate,
                                  &W.ffn_up, &W.ffn_down, &W.ffn_gate_shexp, &W.ffn_up_shexp, &W.ffn_down_shexp,
                                  &W.nextn_eh_proj, &W.nextn_shared_head_head, &W.ffn_gate_exps, &W.ffn_up_exps,
                                  &W.ffn_down_exps})
      add(*w);
  add(output_);
  return grow;
}

void Model::repack_weights(LoadOptions::ExpertRepack expert_mode) {
  const bool experts = expert_mode == LoadOptions::ExpertRepack::AtLoad;
  // The shared matrices are read by every token of every step: repacking them is where
  // the AVX-512 kernel's fewer instructions per weight pay (decode is partly compute-bound,
  // a batch of 2-8 tokens fully). Once a matrix is copied its file pages leave the resident
  // set (matmul reads the copy; the file stays mapped for anything that still reads rows,
  // such as Exact precision), so repacking costs the copy's 2.8 % extra bytes, not twice
  // the memory. The routed experts are most of the file and are read from it lazily;
  // repacking them at load means reading the whole file then, so by default each is
  // repacked when a pass first routes to it (prepare_experts), which reads it anyway.
  std::vector<WeightMatrix*> todo;
  for (LayerWeights& W : layers_) {
    for (WeightMatrix* w : {&W.attn_q, &W.attn_k, &W.attn_v, &W.attn_gate, &W.attn_output, &W.ffn_gate, &W.ffn_up,
                            &W.ffn_down, &W.ffn_gate_shexp, &W.ffn_up_shexp, &W.ffn_down_shexp, &W.nextn_eh_proj,
                            &W.nextn_shared_head_head})
      if (kernels::can_repack(*w)) todo.push_back(w);
    if (experts)
      for (WeightMatrix* w : {&W.ffn_gate_exps, &W.ffn_up_exps, &W.ffn_down_exps})
        if (kernels::can_repack(*w)) todo.push_back(w);
  }
  if (kernels::can_repack(output_)) todo.push_back(&output_);
  // One buffer for all of them.
  for (const WeightMatrix* w : todo) {
    repacked_bytes_ += kernels::repacked_bytes(*w);
    repacked_rows_bytes_ += w->total_bytes();
  }
  if (!todo.empty()) {
    packed_.emplace_back(size_t(repacked_bytes_));
    uint8_t* dst = packed_.back().data();
    for (WeightMatrix* w : todo) {
      kernels::repack_into(*w, dst);
      dst += kernels::repacked_bytes(*w);
      release_pages(w->data, w->total_bytes());
    }
  }
  if (expert_mode != LoadOptions::ExpertRepack::OnFirstUse) return;
  // Address space for every expert's copy; one is written when first routed to.
  std::vector<WeightMatrix*> lazy;
  for (LayerWeights& W : layers_)
    for (WeightMatrix* w : {&W.ffn_gate_exps, &W.ffn_up_exps, &W.ffn_down_exps})
      if (kernels::can_repack(*w)) lazy.push_back(w);
  for (const WeightMatrix* w : lazy) lazy_bytes_ += kernels::repacked_bytes(*w);
  if (lazy.empty()) return;
  try {
    lazy_space_ = std::make_unique<kernels::ReservedBytes>(size_t(lazy_bytes_));
  } catch (const std::bad_alloc&) {
    // No address space for it (e.g. strict overcommit, where MAP_NORESERVE is ignored):
    // the experts stay on the GGUF rows.
    lazy_bytes_ = 0;
    return;
  }
  uint8_t* base = lazy_space_->data();
  for (WeightMatrix* w : lazy) {
    auto p = std::make_unique<LazyPacked>();
    p->base = base;
    p->mat_bytes = kernels::repacked_bytes(*w) / size_t(w->n_mat);
    p->ready = std::make_unique<std::atomic<uint8_t>[]>(size_t(w->n_mat));
    for (int64_t e = 0; e < w->n_mat; ++e) p->ready[size_t(e)].store(0, std::memory_order_relaxed);
    base += kernels::repacked_bytes(*w);
    w->lazy = p.get();
    lazy_packed_.push_back(std::move(p));
  }
}

offload::ExpertCache::Lease Model::prepare_experts(int il, const int32_t* experts, int64_t n,
                                                   ThreadPool& pool) const {
  offload::ExpertCache::Lease lease;
  if (expert_cache_) lease = expert_cache_->acquire(il, experts, n, pool);
  const LayerWeights& W = layers_[size_t(il)];
  struct Todo {
    const WeightMatrix* w;
    int32_t e;
  };
  std::vector<Todo> todo;  // allocates only while experts are still being repacked
  for (const WeightMatrix* w : {&W.ffn_gate_exps, &W.ffn_up_exps, &W.ffn_down_exps})
    if (w->lazy)
      for (int64_t i = 0; i < n; ++i)
        if (!w->lazy->is_ready(experts[i])) todo.push_back({w, experts[i]});
  if (todo.empty()) return lease;
  std::lock_guard<std::mutex> lock(lazy_mu_);
  pool.parallel_stealing(int64_t(todo.size()), [&](int64_t i, int) {
    const Todo& t = todo[size_t(i)];
    const LazyPacked& lp = *t.w->lazy;
    if (lp.is_ready(t.e)) return;  // another pass made it before this one took the lock
    const WeightMatrix one = t.w->matrix(t.e);
    kernels::repack_x16(one, lp.base + size_t(t.e) * lp.mat_bytes);
    release_pages(one.data, one.mat_bytes());
    lazy_done_bytes_.fetch_add(lp.mat_bytes, std::memory_order_relaxed);
    lp.ready[size_t(t.e)].store(1, std::memory_order_release);
  });
  return lease;
}

void Model::prepare_all_experts(ThreadPool& pool) const {
  if (lazy_bytes_ == 0) return;
  std::vector<int32_t> all;  // expert ids 0..n-1, grown to the largest MoE block
  for (int il = 0; il < hp_.n_layer; ++il) {
    const int64_t n = layers_[size_t(il)].ffn_gate_exps.n_mat;
    while (int64_t(all.size()) < n) all.push_back(int32_t(all.size()));
    prepare_experts(il, all.data(), n, pool);
  }
}

uint64_t Model::active_weight_bytes_per_token() const {
  // One embedding row, every trunk weight but the experts, and the top-k experts' share.
  uint64_t bytes = token_embd_.row_bytes + output_.total_bytes();
  for (int il = 0; il < hp_.n_layer; ++il) {
    const LayerWeights& W = layers_[size_t(il)];
    const LayerHParams& L = hp_.layers[size_t(il)];
    for (const WeightMatrix* w : {&W.attn_q, &W.attn_k, &W.attn_v, &W.attn_gate, &W.attn_output, &W.ffn_gate,
                                  &W.ffn_up, &W.ffn_down, &W.ffn_gate_inp, &W.ffn_gate_shexp, &W.ffn_up_shexp,
                                  &W.ffn_down_shexp})
      if (w->present()) bytes += w->total_bytes();
    for (const WeightMatrix* w : {&W.ffn_gate_exps, &W.ffn_up_exps, &W.ffn_down_exps})
      if (w->present()) bytes += w->mat_bytes() * uint64_t(L.n_expert_used);
  }
  return bytes;
}

}  // namespace step35
