// step35 model: hyperparameters (§4.2), tensors (§4.3) and the forward pass (§2) of
// ../shared/docs/step35-model.md.
#include "model/step35.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "runtime/thread_pool.h"
#include "tensor/quants.h"

namespace step35 {

namespace {

std::string key(const char* k) { return std::string("step35.") + k; }
std::string blk(int il, const char* name) { return "blk." + std::to_string(il) + "." + name; }

std::string shape_str(const int64_t* ne, uint32_t n) {
  std::string s = "{";
  for (uint32_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }
float silu(float z) { return z / (1.0f + std::exp(-z)); }

// RMS(x; w) over rows of n (§2 conventions): sum of squares in double, as a reference.
void rms_norm(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    const float scale = 1.0f / std::sqrt(float(ss / double(n)) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * w[i];
  }
}

// SwiGLU with the step35 clamp (§2.5, G9): silu first, then an upper clamp on the gate
// and a symmetric clamp on the up branch; limit <= 1e-6 means no clamp.
void swiglu(const float* g, const float* u, float* out, int64_t n, float limit) {
  if (limit > 1e-6f) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = std::min(silu(g[i]), limit) * std::clamp(u[i], -limit, limit);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = silu(g[i]) * u[i];
  }
}

// NeoX ("rotate-half") RoPE on the first n_rot dims of one head (§2.4 step 3).
void rope_neox(float* x, int32_t n_rot, int32_t pos, float base, const float* freq_factors) {
  const int32_t half = n_rot / 2;
  for (int32_t i = 0; i < half; ++i) {
    double theta = double(pos) * std::pow(double(base), -2.0 * i / double(n_rot));
    if (freq_factors) theta /= double(freq_factors[i]);
    const float c = float(std::cos(theta)), s = float(std::sin(theta));
    const float x0 = x[i], x1 = x[i + half];
    x[i] = x0 * c - x1 * s;
    x[i + half] = x0 * s + x1 * c;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Loading

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& opts) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = gguf::File::open(path);
  m->load_hparams();
  m->tokenizer_ = Tokenizer::from_gguf(*m->file_);
  m->load_tensors(opts);
  if (int64_t(m->tokenizer_->n_vocab()) > m->hp_.n_vocab)
    throw gguf::Error(path + ": tokenizer has " + std::to_string(m->tokenizer_->n_vocab()) +
                      " tokens but token_embd.weight only " + std::to_string(m->hp_.n_vocab) +
                      " rows");
  return m;
}

void Model::load_hparams() {
  const gguf::File& f = *file_;
  const std::string& path = f.path();
  const std::string arch = f.get_str("general.architecture");
  if (arch != "step35")
    throw gguf::Error(path + ": general.architecture is '" + arch + "' (expected 'step35')");

  auto positive = [&](const std::string& k, int64_t v) -> int32_t {
    if (v <= 0 || v > (int64_t(1) << 30))
      throw gguf::Error(path + ": key '" + k + "' = " + std::to_string(v) +
                        " is out of range (expected 1 .. 2^30)");
    return int32_t(v);
  };

  HParams& hp = hp_;
  hp.n_embd = positive(key("embedding_length"), f.get_u32(key("embedding_length")));
  const int32_t n_block = positive(key("block_count"), f.get_u32(key("block_count")));
  hp.n_mtp = int32_t(f.opt_u32(key("nextn_predict_layers")).value_or(0));
  if (hp.n_mtp >= n_block)
    throw gguf::Error(path + ": key '" + key("nextn_predict_layers") + "' = " +
                      std::to_string(hp.n_mtp) + " (expected less than block_count " +
                      std::to_string(n_block) + ")");
  hp.n_layer = n_block - hp.n_mtp;
  hp.head_dim_k = positive(key("attention.key_length"), f.get_u32(key("attention.key_length")));
  hp.head_dim_v = positive(key("attention.value_length"),
                           f.opt_u32(key("attention.value_length")).value_or(uint32_t(hp.head_dim_k)));
  hp.rms_eps = f.get_f32(key("attention.layer_norm_rms_epsilon"));
  if (!(hp.rms_eps > 0.0f) || !std::isfinite(hp.rms_eps))
    throw gguf::Error(path + ": key '" + key("attention.layer_norm_rms_epsilon") +
                      "' must be a positive number");
  hp.swa_window = positive(key("attention.sliding_window"), f.get_u32(key("attention.sliding_window")));
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

  const size_t n = size_t(n_block);
  const auto is_swa = f.get_bool_per_layer(key("attention.sliding_window_pattern"), n);
  const auto n_head = f.get_u32_per_layer(key("attention.head_count"), n);
  const auto n_head_kv = f.get_u32_per_layer(key("attention.head_count_kv"), n);
  const auto n_ff = f.get_u32_per_layer(key("feed_forward_length"), n, 0u);
  const auto n_used = f.get_u32_per_layer(key("expert_used_count"), n, 0u);
  const auto n_ff_exp = f.get_u32_per_layer(key("expert_feed_forward_length"), n, 0u);
  const auto clamp_exp = f.get_f32_per_layer(key("swiglu_clamp_exp"), n, 0.0f);
  const auto clamp_shexp = f.get_f32_per_layer(key("swiglu_clamp_shexp"), n, 0.0f);
  // §4.2 / G2: SWA rotary dims = rope.dimension_count (default key_length), optionally
  // overridden by dimension_count_swa; full layers rotate half of rope.dimension_count.
  const uint32_t rot = f.opt_u32(key("rope.dimension_count")).value_or(uint32_t(hp.head_dim_k));
  const uint32_t rot_swa = f.opt_u32(key("rope.dimension_count_swa")).value_or(rot);
  const float base = f.opt_f32(key("rope.freq_base")).value_or(10000.0f);
  const float base_swa = f.opt_f32(key("rope.freq_base_swa")).value_or(10000.0f);
  const bool has_rope_freqs = f.find_tensor("rope_freqs.weight") != nullptr;

  hp.layers.resize(n);
  for (size_t il = 0; il < n; ++il) {
    LayerHParams& L = hp.layers[il];
    const std::string where = path + ": layer " + std::to_string(il) + ": ";
    L.is_swa = is_swa[il];
    L.n_head = positive(key("attention.head_count"), n_head[il]);
    L.n_head_kv = positive(key("attention.head_count_kv"), n_head_kv[il]);
    if (L.n_head % L.n_head_kv != 0)
      throw gguf::Error(where + "head_count " + std::to_string(L.n_head) +
                        " is not a multiple of head_count_kv " + std::to_string(L.n_head_kv));
    L.n_rot = int32_t(L.is_swa ? rot_swa : rot / 2);
    if (L.n_rot % 2 != 0 || L.n_rot > hp.head_dim_k)
      throw gguf::Error(where + "rotary dims " + std::to_string(L.n_rot) +
                        " (expected an even number <= key_length " + std::to_string(hp.head_dim_k) + ")");
    L.rope_base = L.is_swa ? base_swa : base;
    L.use_rope_freqs = !L.is_swa && has_rope_freqs;
    L.is_moe = f.find_tensor(blk(int(il), "ffn_gate_inp.weight")) != nullptr;
    L.n_ff = int32_t(n_ff[il]);
    L.n_expert_used = int32_t(n_used[il]);
    L.n_ff_exp = int32_t(n_ff_exp[il]);
    L.clamp_exp = clamp_exp[il];
    L.clamp_shexp = clamp_shexp[il];
    if (L.is_moe) {
      if (hp.n_expert <= 0)
        throw gguf::Error(where + "MoE layer but key '" + key("expert_count") + "' is missing or 0");
      if (L.n_expert_used <= 0 || L.n_expert_used > hp.n_expert)
        throw gguf::Error(where + "expert_used_count " + std::to_string(L.n_expert_used) +
                          " (expected 1 .. expert_count " + std::to_string(hp.n_expert) + ")");
      if (L.n_ff_exp <= 0)
        throw gguf::Error(where + "key '" + key("expert_feed_forward_length") + "' is missing or 0");
    }
  }
}

void Model::load_tensors(const LoadOptions& opts) {
  const gguf::File& f = *file_;
  const std::string& path = f.path();
  const HParams& hp = hp_;
  size_t n_bound = 0;
  const size_t n_total = f.tensors().size();
  const bool show_progress = opts.progress && isatty(2);

  // Looks up a tensor, checks its shape, and returns a view (absent + optional -> empty).
  auto get = [&](const std::string& name, std::vector<int64_t> shape, bool required) -> WeightMatrix {
    const gguf::TensorInfo* t = f.find_tensor(name);
    if (!t) {
      if (required) throw gguf::Error(path + ": missing tensor '" + name + "'");
      return {};
    }
    bool ok = t->n_dims >= 1;
    for (size_t d = 0; d < 4 && ok; ++d) {
      const int64_t want = d < shape.size() ? shape[d] : 1;
      if (t->ne[d] != want) ok = false;
    }
    if (!ok)
      throw gguf::Error(path + ": tensor '" + name + "' has shape " + shape_str(t->ne, t->n_dims) +
                        " (expected " + shape_str(shape.data(), uint32_t(shape.size())) + ")");
    WeightMatrix w;
    w.data = t->data;
    w.type = DType(t->type);
    w.n_in = t->ne[0];
    w.n_out = t->ne[1];
    w.n_mat = t->ne[2];
    w.row_bytes = *row_bytes(w.type, w.n_in);
    weight_bytes_ += t->nbytes;
    ++n_bound;
    if (show_progress && (n_bound % 16 == 0 || n_bound == n_total)) {
      const int width = 40, done = int(width * n_bound / std::max<size_t>(n_total, 1));
      std::fprintf(stderr, "\rloading [%.*s%*s] %zu/%zu tensors", done,
                   "========================================", width - done, "", n_bound, n_total);
    }
    return w;
  };
  auto vec = [&](const std::string& name, int64_t n, bool required) -> std::vector<float> {
    WeightMatrix w = get(name, {n}, required);
    std::vector<float> v;
    if (!w.present()) return v;
    v.resize(size_t(n));
    dequantize_row_ref(w.type, w.data, v.data(), n);
    return v;
  };

  const int64_t E = hp.n_embd;
  const gguf::TensorInfo* te = f.find_tensor("token_embd.weight");
  if (!te) throw gguf::Error(path + ": missing tensor 'token_embd.weight'");
  if (te->ne[1] <= 0 || te->ne[1] > (int64_t(1) << 31) - 1)
    throw gguf::Error(path + ": tensor 'token_embd.weight' has an invalid vocabulary size");
  hp_.n_vocab = int32_t(te->ne[1]);
  const int64_t V = hp.n_vocab;
  token_embd_ = get("token_embd.weight", {E, V}, true);
  output_norm_ = vec("output_norm.weight", E, true);
  output_ = get("output.weight", {E, V}, true);
  if (f.find_tensor("rope_freqs.weight")) {
    const gguf::TensorInfo* rf = f.find_tensor("rope_freqs.weight");
    const int64_t n_rf = rf->ne[0];
    int32_t max_half = 0;
    for (const auto& L : hp.layers)
      if (L.use_rope_freqs) max_half = std::max(max_half, L.n_rot / 2);
    if (n_rf < max_half)
      throw gguf::Error(path + ": tensor 'rope_freqs.weight' has " + std::to_string(n_rf) +
                        " entries (expected at least " + std::to_string(max_half) + ")");
    rope_freqs_ = vec("rope_freqs.weight", n_rf, true);
  }

  layers_.resize(hp.layers.size());
  for (int il = 0; il < int(hp.layers.size()); ++il) {
    const LayerHParams& L = hp.layers[size_t(il)];
    LayerWeights& W = layers_[size_t(il)];
    const bool is_mtp = il >= hp.n_layer;
    if (is_mtp && !f.find_tensor(blk(il, "nextn.eh_proj.weight"))) continue;  // MTP tensors absent
    const int64_t D = hp.head_dim_k, Dv = hp.head_dim_v, H = L.n_head, G = L.n_head_kv;
    W.attn_norm = vec(blk(il, "attn_norm.weight"), E, true);
    if (f.find_tensor(blk(il, "attn_qkv.weight"))) {
      // Fused Q‖K‖V: three consecutive row ranges of one matrix.
      WeightMatrix qkv = get(blk(il, "attn_qkv.weight"), {E, H * D + G * D + G * Dv}, true);
      W.attn_q = qkv, W.attn_q.n_out = H * D;
      W.attn_k = qkv, W.attn_k.n_out = G * D, W.attn_k.data = qkv.row(H * D);
      W.attn_v = qkv, W.attn_v.n_out = G * Dv, W.attn_v.data = qkv.row(H * D + G * D);
    } else {
      W.attn_q = get(blk(il, "attn_q.weight"), {E, H * D}, true);
      W.attn_k = get(blk(il, "attn_k.weight"), {E, G * D}, true);
      W.attn_v = get(blk(il, "attn_v.weight"), {E, G * Dv}, true);
    }
    W.attn_q_norm = vec(blk(il, "attn_q_norm.weight"), D, false);
    W.attn_k_norm = vec(blk(il, "attn_k_norm.weight"), D, false);
    W.attn_gate = get(blk(il, "attn_gate.weight"), {E, H}, false);
    W.attn_output = get(blk(il, "attn_output.weight"), {H * Dv, E}, true);
    W.ffn_norm = vec(blk(il, "ffn_norm.weight"), E, true);
    if (L.is_moe) {
      const int64_t X = hp.n_expert, F = L.n_ff_exp;
      W.ffn_gate_inp = get(blk(il, "ffn_gate_inp.weight"), {E, X}, true);
      W.exp_probs_b = vec(blk(il, "exp_probs_b.bias"), X, false);
      W.ffn_gate_exps = get(blk(il, "ffn_gate_exps.weight"), {E, F, X}, true);
      W.ffn_up_exps = get(blk(il, "ffn_up_exps.weight"), {E, F, X}, true);
      W.ffn_down_exps = get(blk(il, "ffn_down_exps.weight"), {F, E, X}, true);
      if (f.find_tensor(blk(il, "ffn_up_shexp.weight"))) {
        const gguf::TensorInfo* sh = f.find_tensor(blk(il, "ffn_up_shexp.weight"));
        const int64_t FS = hp.n_ff_shexp > 0 ? hp.n_ff_shexp : sh->ne[1];
        W.ffn_gate_shexp = get(blk(il, "ffn_gate_shexp.weight"), {E, FS}, true);
        W.ffn_up_shexp = get(blk(il, "ffn_up_shexp.weight"), {E, FS}, true);
        W.ffn_down_shexp = get(blk(il, "ffn_down_shexp.weight"), {FS, E}, true);
      }
    } else {
      if (L.n_ff <= 0)
        throw gguf::Error(path + ": layer " + std::to_string(il) + ": dense layer but key '" +
                          key("feed_forward_length") + "' is missing or 0");
      W.ffn_gate = get(blk(il, "ffn_gate.weight"), {E, L.n_ff}, true);
      W.ffn_up = get(blk(il, "ffn_up.weight"), {E, L.n_ff}, true);
      W.ffn_down = get(blk(il, "ffn_down.weight"), {L.n_ff, E}, true);
    }
    if (is_mtp) {
      W.nextn_eh_proj = get(blk(il, "nextn.eh_proj.weight"), {2 * E, E}, true);
      W.nextn_enorm = vec(blk(il, "nextn.enorm.weight"), E, true);
      W.nextn_hnorm = vec(blk(il, "nextn.hnorm.weight"), E, true);
      W.nextn_shared_head_norm = vec(blk(il, "nextn.shared_head_norm.weight"), E, false);
      W.nextn_shared_head_head = get(blk(il, "nextn.shared_head_head.weight"), {E, V}, false);
      W.nextn_embed_tokens = get(blk(il, "nextn.embed_tokens.weight"), {E, V}, false);
      ++n_mtp_loaded_;
    }
  }
  if (show_progress) std::fprintf(stderr, "\n");
}

std::unique_ptr<KvCache> Model::make_cache(int32_t n_ctx, int32_t max_batch, bool with_mtp) const {
  std::vector<KvLayerShape> shapes;
  const int32_t n = hp_.n_layer + (with_mtp ? n_mtp_loaded_ : 0);
  for (int32_t il = 0; il < n; ++il) {
    const LayerHParams& L = hp_.layers[size_t(il)];
    shapes.push_back({L.is_swa, L.n_head_kv, hp_.head_dim_k, hp_.head_dim_v});
  }
  return std::make_unique<KvCache>(shapes, n_ctx, hp_.swa_window, max_batch);
}

// ---------------------------------------------------------------------------------------
// Forward pass (§2)

void Model::forward(KvCache& cache, const int32_t* tokens, int32_t n_tokens, bool all_logits,
                    std::vector<float>& logits, ThreadPool& pool, std::vector<float>* hidden,
                    const DumpFn& dump) const {
  if (n_tokens <= 0) throw std::invalid_argument("forward: no tokens");
  if (int64_t(cache.n_pos()) + n_tokens > cache.n_ctx())
    throw std::length_error("context is full: " + std::to_string(cache.n_pos()) + " + " +
                            std::to_string(n_tokens) + " tokens exceed the context size " +
                            std::to_string(cache.n_ctx()));
  for (int32_t t = 0; t < n_tokens; ++t)
    if (tokens[t] < 0 || tokens[t] >= hp_.n_vocab)
      throw std::out_of_range("token id " + std::to_string(tokens[t]) + " is outside the vocabulary (0.." +
                              std::to_string(hp_.n_vocab - 1) + ")");
  const size_t V = size_t(hp_.n_vocab), E = size_t(hp_.n_embd);
  logits.assign((all_logits ? size_t(n_tokens) : 1) * V, 0.0f);
  if (hidden) hidden->assign(size_t(n_tokens) * E, 0.0f);
  for (int32_t done = 0; done < n_tokens;) {
    const int32_t n = std::min(cache.max_batch(), n_tokens - done);
    const bool last_chunk = done + n == n_tokens;
    float* out = all_logits ? logits.data() + size_t(done) * V : (last_chunk ? logits.data() : nullptr);
    forward_chunk(cache, tokens + done, n, all_logits, out, pool,
                  hidden ? hidden->data() + size_t(done) * E : nullptr, dump);
    done += n;
  }
}

void Model::forward_chunk(KvCache& cache, const int32_t* tokens, int32_t T, bool all_logits,
                          float* logits, ThreadPool& pool, float* hidden, const DumpFn& dump) const {
  const HParams& hp = hp_;
  const int64_t E = hp.n_embd;
  const int32_t pos0 = cache.n_pos();
  std::vector<float> x(size_t(T * E)), a(size_t(T * E)), tmp(size_t(T * E));

  // §2.2 embedding: row lookup, no scaling.
  for (int32_t t = 0; t < T; ++t) dequantize_row(token_embd_, tokens[t], x.data() + t * E);

  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const LayerWeights& W = layers_[size_t(il)];
    if (dump) dump("attn_norm_in", il, x.data(), T * E);
    // §2.3 pre-norm residual block.
    rms_norm(x.data(), W.attn_norm.data(), a.data(), T, E, hp.rms_eps);
    if (dump) dump("attn_norm", il, a.data(), T * E);
    attention(L, W, size_t(il), cache, pos0, T, a.data(), tmp.data(), pool, il, dump);
    for (int64_t i = 0; i < T * E; ++i) x[size_t(i)] += tmp[size_t(i)];
    if (dump) dump("ffn_inp", il, x.data(), T * E);
    rms_norm(x.data(), W.ffn_norm.data(), a.data(), T, E, hp.rms_eps);
    if (dump) dump("ffn_norm", il, a.data(), T * E);
    if (L.is_moe)
      moe_ffn(L, W, a.data(), T, tmp.data(), pool, il, dump);
    else
      dense_ffn(L, W, a.data(), T, tmp.data(), pool);
    if (dump) dump("ffn_out", il, tmp.data(), T * E);
    for (int64_t i = 0; i < T * E; ++i) x[size_t(i)] += tmp[size_t(i)];
  }
  cache.set_n_pos(pos0 + T);

  // §2.7 output.
  if (hidden) std::copy(x.begin(), x.end(), hidden);
  if (dump) dump("h_nextn", -1, x.data(), T * E);
  if (!logits) return;
  const int32_t first = all_logits ? 0 : T - 1;
  const int32_t n_out = T - first;
  rms_norm(x.data() + first * E, output_norm_.data(), a.data(), n_out, E, hp.rms_eps);
  if (dump) dump("result_norm", -1, a.data(), n_out * E);
  matmul(output_, a.data(), n_out, logits, pool);
}

// §2.4 attention with per-head Q/K norm, partial NeoX RoPE, causal (+ sliding window)
// mask, GQA and the head-wise sigmoid gate. Writes W_o · gated heads into out (T × E).
void Model::attention(const LayerHParams& L, const LayerWeights& W, size_t cache_layer, KvCache& cache,
                      int32_t pos0, int32_t T, const float* a, float* out, ThreadPool& pool, int il,
                      const DumpFn& dump) const {
  const HParams& hp = hp_;
  const int64_t H = L.n_head, G = L.n_head_kv, D = hp.head_dim_k, Dv = hp.head_dim_v;
  std::vector<float> q(size_t(T * H * D)), k(size_t(T * G * D)), v(size_t(T * G * Dv));
  matmul(W.attn_q, a, T, q.data(), pool);
  matmul(W.attn_k, a, T, k.data(), pool);
  matmul(W.attn_v, a, T, v.data(), pool);

  const float* freqs = L.use_rope_freqs ? rope_freqs_.data() : nullptr;
  for (int32_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      float* qh = q.data() + (t * H + h) * D;
      if (!W.attn_q_norm.empty()) rms_norm(qh, W.attn_q_norm.data(), qh, 1, D, hp.rms_eps);
      rope_neox(qh, L.n_rot, pos0 + t, L.rope_base, freqs);
    }
    for (int64_t g = 0; g < G; ++g) {
      float* kh = k.data() + (t * G + g) * D;
      if (!W.attn_k_norm.empty()) rms_norm(kh, W.attn_k_norm.data(), kh, 1, D, hp.rms_eps);
      rope_neox(kh, L.n_rot, pos0 + t, L.rope_base, freqs);
    }
    std::memcpy(cache.k(cache_layer, pos0 + t), k.data() + t * G * D, size_t(G * D) * sizeof(float));
    std::memcpy(cache.v(cache_layer, pos0 + t), v.data() + t * G * Dv, size_t(G * Dv) * sizeof(float));
  }
  if (dump) {
    dump("Qcur_pos", il, q.data(), T * H * D);
    dump("Kcur_pos", il, k.data(), T * G * D);
    dump("Vcur", il, v.data(), T * G * Dv);
  }

  // Scores, softmax and V mix per (token, head). Query head h reads KV head h / (H/G).
  std::vector<float> o(size_t(T * H * Dv));
  const float scale = 1.0f / std::sqrt(float(D));
  const int32_t window = hp.swa_window;
  pool.parallel_for(T * H, [&](int64_t begin, int64_t end, int) {
    std::vector<float> scores;
    for (int64_t job = begin; job < end; ++job) {
      const int32_t t = int32_t(job / H);
      const int64_t h = job % H, g = h / (H / G);
      const int32_t p = pos0 + t;
      const int32_t lo = L.is_swa ? std::max(0, p - window + 1) : 0;  // §2.4 step 5
      const float* qh = q.data() + (t * H + h) * D;
      scores.resize(size_t(p - lo + 1));
      float max_s = -INFINITY;
      for (int32_t u = lo; u <= p; ++u) {
        const float s = dot_f32(qh, cache.k(cache_layer, u) + g * D, D) * scale;
        scores[size_t(u - lo)] = s;
        max_s = std::max(max_s, s);
      }
      float sum = 0;
      for (float& s : scores) sum += (s = std::exp(s - max_s));
      const float inv = 1.0f / sum;
      float* oh = o.data() + (t * H + h) * Dv;
      std::fill(oh, oh + Dv, 0.0f);
      for (int32_t u = lo; u <= p; ++u) {
        const float w = scores[size_t(u - lo)] * inv;
        const float* vu = cache.v(cache_layer, u) + g * Dv;
        for (int64_t i = 0; i < Dv; ++i) oh[i] += w * vu[i];
      }
    }
  });
  if (dump) dump("attn_out", il, o.data(), T * H * Dv);

  // §2.4 step 7: the gate reads the attention input `a`, one scalar per query head.
  if (W.attn_gate.present()) {
    std::vector<float> gate(size_t(T * H));
    matmul(W.attn_gate, a, T, gate.data(), pool);
    for (float& g : gate) g = sigmoid(g);
    if (dump) dump("attn_gate_sigmoid", il, gate.data(), T * H);
    for (int64_t th = 0; th < T * H; ++th)
      for (int64_t i = 0; i < Dv; ++i) o[size_t(th * Dv + i)] *= gate[size_t(th)];
    if (dump) dump("attn_gated", il, o.data(), T * H * Dv);
  }
  matmul(W.attn_output, o.data(), T, out, pool);
}

// §2.5 dense SwiGLU MLP; the shared clamp list governs dense layers.
void Model::dense_ffn(const LayerHParams& L, const LayerWeights& W, const float* f, int32_t T,
                      float* out, ThreadPool& pool) const {
  const int64_t F = W.ffn_gate.n_out;
  std::vector<float> g(size_t(T * F)), u(size_t(T * F));
  matmul(W.ffn_gate, f, T, g.data(), pool);
  matmul(W.ffn_up, f, T, u.data(), pool);
  swiglu(g.data(), u.data(), g.data(), T * F, L.clamp_shexp);
  matmul(W.ffn_down, g.data(), T, out, pool);
}

// §2.6 MoE: sigmoid router, biased top-k selection, unbiased weights renormalised and
// scaled, routed experts + the always-on shared expert. Tokens are grouped by expert so
// each selected expert's weights are read once per batch.
void Model::moe_ffn(const LayerHParams& L, const LayerWeights& W, const float* f, int32_t T,
                    float* out, ThreadPool& pool, int il, const DumpFn& dump) const {
  const HParams& hp = hp_;
  const int64_t E = hp.n_embd, X = hp.n_expert, K = L.n_expert_used, F = L.n_ff_exp;
  std::vector<float> probs(size_t(T * X));
  matmul(W.ffn_gate_inp, f, T, probs.data(), pool);
  for (int32_t t = 0; t < T; ++t) {
    float* pt = probs.data() + t * X;
    if (hp.gating_sigmoid) {
      for (int64_t e = 0; e < X; ++e) pt[e] = sigmoid(pt[e]);
    } else {
      const float mx = *std::max_element(pt, pt + X);
      float sum = 0;
      for (int64_t e = 0; e < X; ++e) sum += (pt[e] = std::exp(pt[e] - mx));
      for (int64_t e = 0; e < X; ++e) pt[e] /= sum;
    }
  }

  std::vector<int32_t> topk(size_t(T * K));
  std::vector<float> weights(size_t(T * K)), weights_raw(size_t(T * K));
  std::vector<int32_t> order(static_cast<size_t>(X));
  std::vector<float> sel(static_cast<size_t>(X));
  for (int32_t t = 0; t < T; ++t) {
    const float* pt = probs.data() + t * X;
    for (int64_t e = 0; e < X; ++e) sel[size_t(e)] = pt[e] + (W.exp_probs_b.empty() ? 0.0f : W.exp_probs_b[size_t(e)]);
    std::iota(order.begin(), order.end(), 0);
    // The bias only decides which experts are chosen (G8). Ties: lower id first.
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t x1, int32_t x2) {
      return sel[size_t(x1)] > sel[size_t(x2)] || (sel[size_t(x1)] == sel[size_t(x2)] && x1 < x2);
    });
    float sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      topk[size_t(t * K + k)] = order[size_t(k)];
      weights_raw[size_t(t * K + k)] = pt[order[size_t(k)]];
      sum += pt[order[size_t(k)]];
    }
    const float norm = hp.expert_weights_norm ? 1.0f / std::max(sum, 6.103515625e-5f) : 1.0f;
    for (int64_t k = 0; k < K; ++k)
      weights[size_t(t * K + k)] = weights_raw[size_t(t * K + k)] * norm * hp.expert_weights_scale;
  }
  if (dump) {
    std::vector<float> ids(topk.begin(), topk.end());
    dump("ffn_moe_topk", il, ids.data(), T * K);
    dump("ffn_moe_weights", il, weights_raw.data(), T * K);
    dump("ffn_moe_weights_scaled", il, weights.data(), T * K);
  }

  // Group (token, slot) pairs by expert.
  std::vector<std::vector<int32_t>> rows_of(static_cast<size_t>(X)), slot_of(static_cast<size_t>(X));
  for (int32_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      rows_of[size_t(topk[size_t(t * K + k)])].push_back(t);
      slot_of[size_t(topk[size_t(t * K + k)])].push_back(int32_t(t * K + k));
    }
  std::vector<float> routed(size_t(T * K * E), 0.0f);  // per (token, slot) expert output
  std::vector<float> g, u, d;
  for (int64_t e = 0; e < X; ++e) {
    const auto& rows = rows_of[size_t(e)];
    if (rows.empty()) continue;
    const int64_t n = int64_t(rows.size());
    g.resize(size_t(n * F)), u.resize(size_t(n * F)), d.resize(size_t(n * E));
    matmul_rows(W.ffn_gate_exps.matrix(e), f, rows.data(), n, g.data(), pool);
    matmul_rows(W.ffn_up_exps.matrix(e), f, rows.data(), n, u.data(), pool);
    swiglu(g.data(), u.data(), g.data(), n * F, L.clamp_exp);
    matmul(W.ffn_down_exps.matrix(e), g.data(), n, d.data(), pool);
    for (int64_t j = 0; j < n; ++j)
      std::copy(d.begin() + j * E, d.begin() + (j + 1) * E, routed.begin() + slot_of[size_t(e)][size_t(j)] * E);
  }
  // Weighted sum in top-k order (the order llama.cpp adds them in).
  std::fill(out, out + T * E, 0.0f);
  for (int32_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const float w = weights[size_t(t * K + k)];
      const float* r = routed.data() + (t * K + k) * E;
      float* o = out + t * E;
      for (int64_t i = 0; i < E; ++i) o[i] += w * r[i];
    }
  if (dump) dump("ffn_moe_out", il, out, T * E);

  if (W.ffn_up_shexp.present()) {
    const int64_t FS = W.ffn_up_shexp.n_out;
    std::vector<float> sg(size_t(T * FS)), su(size_t(T * FS)), so(size_t(T * E));
    matmul(W.ffn_gate_shexp, f, T, sg.data(), pool);
    matmul(W.ffn_up_shexp, f, T, su.data(), pool);
    swiglu(sg.data(), su.data(), sg.data(), T * FS, L.clamp_shexp);
    matmul(W.ffn_down_shexp, sg.data(), T, so.data(), pool);
    if (dump) dump("ffn_shared_out", il, so.data(), T * E);
    for (int64_t i = 0; i < T * E; ++i) out[i] += so[size_t(i)];
  }
}

}  // namespace step35
