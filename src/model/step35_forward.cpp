// The step35 forward pass (docs/architecture.md, "The model") over a batch of
// sequence chunks. Every matrix product goes through kernels::matmul; independent products
// of one step are fused into one parallel section (run_matmuls). Each token's result is
// independent of the other tokens in the batch (see kernels.h's invariance contract and
// attention/attention.h's fixed spans and merge order), so batching never changes outputs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "attention/attention.h"
#include "exec/thread_pool.h"
#include "model/layer_math.h"
#include "model/step35.h"
#include "model/workspace.h"

namespace step35 {

namespace {

// Runs fn(t) for t < n, on the pool only when there is enough work to share.
template <typename Fn>
void for_each_row(int64_t n, ThreadPool& pool, int64_t min_parallel, Fn&& fn) {
  if (n < min_parallel || pool.n_threads() == 1) {
    for (int64_t t = 0; t < n; ++t) fn(t);
    return;
  }
  pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) fn(t);
  });
}

}  // namespace

class ForwardPass {
 public:
  ForwardPass(const Model& m, KvPool& kv, const std::vector<SeqChunk>& chunks, BatchOutput& out, Workspace& ws,
              ThreadPool& pool, const ForwardOptions& opts)
      : m_(m), hp_(m.hp_), weights_(m.weights()), kv_(kv), chunks_(chunks), out_(out), ws_(ws), pool_(pool),
        opts_(opts) {}

  void run();
  // MTP block k (architecture.md "MTP heads") over the chunks, `h_in` = the hidden state paired
  // with each token.
  void run_mtp(int k, const float* h_in);

 private:
  void validate_and_reserve();
  void prepare_batch();
  void decoder_block(int il);
  void head(const WeightMatrix& w_out, const std::vector<float>& norm);
  // cos/sin of every token's RoPE angles for a layer's rotary setting, [T][cos half | sin
  // half]; computed once per pass per setting (full and SWA layers differ).
  const float* rope_table(const LayerHParams& L);
  // The KV pool layer of model layer il: the trunk pool holds layers 0..n_layer-1; an
  // MTP block's pool holds only that block.
  size_t kv_layer(int il) const { return size_t(il - kv_layer_base_); }
  void embed();
  void attention(int il);
  void dense_ffn(int il);
  void moe_ffn(int il);

  // The steps of moe_ffn and what they hand on.
  struct MoeRoute {          // the experts each token goes to
    int64_t K = 0;           // experts per token (the layer's top-k)
    int32_t* topk = nullptr;    // [T][K] expert ids, best first
    int32_t* n_kept = nullptr;  // [T] how many of them run (fewer under the adaptive policy)
    float* w_raw = nullptr;     // [T][K] router probabilities of the selected experts
    float* w = nullptr;         // [T][K] combination weights (0 for the dropped ones)
  };
  struct ExpertGroups {      // the kept (token, slot) pairs by expert
    const std::vector<std::vector<int32_t>>* tokens = nullptr;  // per expert: its tokens, in order
    int64_t* first_row = nullptr;  // per expert: its first row in the products
    int32_t* slot_row = nullptr;   // (token * K + slot) -> row
    int64_t n_rows = 0;
  };
  struct ExpertActs {        // SwiGLU outputs in the down projections' input formats
    kernels::ActType type = kernels::ActType::F32, shared_type = kernels::ActType::F32;
    size_t stride = 0, shared_stride = 0;
    uint8_t* rows = nullptr;    // a row per (token, slot) pair
    // Per row, its format where replaced experts (model patches) of another type than the
    // tensor mix formats in the layer (rows are then `stride` apart, the widest format);
    // null when every row has `type`.
    const uint8_t* row_type = nullptr;
    uint8_t* shared = nullptr;  // a row per token (null without a shared expert)
  };
  struct ExpertOutputs {     // down products
    float* down = nullptr;      // a row of n_embd per (token, slot) pair
    float* shared = nullptr;    // a row per token (null without a shared expert)
  };
  MoeRoute route_tokens(int il);
  void prefetch_next_block(int il);
  void route_token(const LayerWeights& W, int64_t t, float* router_row, const MoeRoute& r) const;
  ExpertGroups group_by_expert(const MoeRoute& route);
  void record_routing(int il, const MoeRoute& route, const ExpertGroups& groups);
  ExpertOutputs expert_products(int il, const ExpertGroups& groups);
  bool computes_here(int il, int64_t e) const;  // expert e of block il runs in this process
  bool replaced_with_other_type(int il, int64_t e) const;
  bool fully_replaced(int il, int64_t e) const;
  // The groups' tokens of the experts the other processes compute (expert parallelism).
  const std::vector<std::vector<int32_t>>& remote_tokens(int il, const ExpertGroups& groups);
  ExpertActs expert_gate_up(int il, const ExpertGroups& groups);
  ExpertOutputs expert_down(int il, const ExpertGroups& groups, const ExpertActs& acts);
  void combine_experts(int il, const MoeRoute& route, const ExpertGroups& groups, const ExpertOutputs& outputs);

  void dump(const char* name, int layer, const float* data, int64_t n) {
    if (opts_.dump) opts_.dump(name, layer, data, n);
  }
  // Normalises ws.x rows into ws.a with `w` and makes ws.acts serve them.
  void norm_input(const std::vector<float>& w) {
    const int64_t E = hp_.n_embd;
    float* x = ws_.x.get(size_t(T_ * E));
    float* a = ws_.a.get(size_t(T_ * E));
    for_each_row(T_, pool_, 16, [&](int64_t t) { rms_norm_row(x + t * E, w.data(), a + t * E, E, hp_.rms_eps); });
    ws_.acts.reset(a, T_, E, E);
  }
  kernels::ActRows acts_for(const WeightMatrix& w) { return ws_.acts.get(kernels::act_type(w.type, prec_), pool_); }
  void add_job(const WeightMatrix& w, const kernels::ActRows& x, float* y, int64_t ldy) {
    MatJob j;
    j.w = w;
    j.x = x;
    j.y = y;
    j.ldy = ldy;
    ws_.jobs.push_back(j);
  }

  const Model& m_;
  const HParams& hp_;
  const std::shared_ptr<const WeightSet> weights_;  // held for the whole pass
  KvPool& kv_;
  const std::vector<SeqChunk>& chunks_;
  BatchOutput& out_;
  Workspace& ws_;
  ThreadPool& pool_;
  const ForwardOptions& opts_;
  Precision prec_ = Precision::Native;
  int64_t T_ = 0;
  int32_t* pos_ = nullptr;     // per token: position (RoPE)
  int32_t* slot_ = nullptr;    // per token: KV slot in its sequence (position - pos_offset)
  int32_t* chunk_of_ = nullptr;
  int32_t moe_index_ = 0;      // MoE layers seen so far (for routing stats)
  int kv_layer_base_ = 0;
  bool collect_routing_ = true;
};

void Model::forward(KvPool& kv, const std::vector<SeqChunk>& chunks, BatchOutput& out, Workspace& ws,
                    ThreadPool& pool, const ForwardOptions& opts) const {
  ForwardPass(*this, kv, chunks, out, ws, pool, opts).run();
}

void Model::forward_mtp(int k, KvPool& kv, const std::vector<SeqChunk>& chunks, const float* h_in, BatchOutput& out,
                        Workspace& ws, ThreadPool& pool, const ForwardOptions& opts) const {
  if (k < 0 || k >= n_mtp_loaded_) throw std::invalid_argument("forward_mtp: the model has no MTP block " + std::to_string(k));
  if (kv.n_layers() != 1) throw std::invalid_argument("forward_mtp: the KV pool must hold exactly the MTP block");
  ForwardPass(*this, kv, chunks, out, ws, pool, opts).run_mtp(k, h_in);
}

void ForwardPass::validate_and_reserve() {
  if (chunks_.empty()) throw std::invalid_argument("forward: empty batch");
  if (kv_.n_layers() + size_t(kv_layer_base_) < size_t(hp_.n_layer) && kv_layer_base_ == 0)
    throw std::invalid_argument("forward: the KV pool has fewer layers than the model");
  T_ = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const SeqChunk& ch = chunks_[c];
    if (!ch.seq || ch.n_tokens <= 0 || !ch.tokens) throw std::invalid_argument("forward: empty chunk");
    for (size_t d = 0; d < c; ++d)
      if (chunks_[d].seq == ch.seq) throw std::invalid_argument("forward: one sequence appears twice in a batch");
    for (int32_t i = 0; i < ch.n_tokens; ++i)
      if ((ch.tokens[i] < 0 && !(ch.tokens[i] == -1 && ch.embeddings)) || ch.tokens[i] >= hp_.n_vocab)
        throw std::out_of_range("token id " + std::to_string(ch.tokens[i]) + " is outside the vocabulary (0.." +
                                std::to_string(hp_.n_vocab - 1) + ")");
    if (int64_t(ch.seq->n_pos) + ch.n_tokens > (int64_t(1) << 30))
      throw std::length_error("forward: position out of range");
    T_ += ch.n_tokens;
  }
  // Reserve KV blocks for every chunk, or for none.
  for (size_t c = 0; c < chunks_.size(); ++c) {
    KvSeq& s = *chunks_[c].seq;
    if (!kv_.reserve(s, s.n_pos + chunks_[c].n_tokens)) {
      for (size_t d = 0; d < c; ++d) kv_.truncate(*chunks_[d].seq, chunks_[d].seq->n_pos);
      throw std::runtime_error("KV cache is full: no free blocks for " + std::to_string(chunks_[c].n_tokens) +
                               " more positions");
    }
  }
}

void ForwardPass::prepare_batch() {
  prec_ = opts_.precision;
  validate_and_reserve();
  pos_ = ws_.pos.get(size_t(T_));
  slot_ = ws_.slot.get(size_t(T_));
  chunk_of_ = ws_.seq_of.get(size_t(T_));
  int64_t t = 0;
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (int32_t i = 0; i < chunks_[c].n_tokens; ++i, ++t) {
      slot_[t] = chunks_[c].seq->n_pos + i;
      pos_[t] = slot_[t] + chunks_[c].pos_offset;
      chunk_of_[t] = int32_t(c);
    }
  out_.routing.clear();
  out_.routing.n_expert = hp_.n_expert;
  moe_index_ = 0;
  ws_.rope_keys.clear();
}

const float* ForwardPass::rope_table(const LayerHParams& L) {
  const bool freqs = L.use_rope_freqs;
  for (size_t i = 0; i < ws_.rope_keys.size(); ++i) {
    const auto& k = ws_.rope_keys[i];
    if (k.n_rot == L.n_rot && k.base == L.rope_base && k.freqs == freqs) return ws_.rope_tables[i].v.data();
  }
  const size_t i = ws_.rope_keys.size();
  ws_.rope_keys.push_back({L.n_rot, L.rope_base, freqs});
  if (ws_.rope_tables.size() <= i) ws_.rope_tables.resize(i + 1);
  const int32_t half = L.n_rot / 2;
  float* tab = ws_.rope_tables[i].get(size_t(T_) * size_t(2 * half));
  const float* ff = freqs ? m_.rope_freqs_.data() : nullptr;
  for_each_row(T_, pool_, 64, [&](int64_t t) { rope_angles(pos_[t], L.n_rot, L.rope_base, ff, tab + t * 2 * half); });
  return tab;
}

// Pre-norm residual block on ws.x (architecture.md "Decoder block and output head"): h1 = h +
// Attention(RMS(h)); out = h1 + FFN(RMS(h1)).
void ForwardPass::decoder_block(int il) {
  const LayerHParams& L = hp_.layers[size_t(il)];
  const LayerWeights& W = weights_->layers[size_t(il)];
  const int64_t E = hp_.n_embd;
  float* x = ws_.x.get(size_t(T_ * E));
  dump("attn_norm_in", il, x, T_ * E);
  norm_input(W.attn_norm);
  dump("attn_norm", il, ws_.a.get(0), T_ * E);
  attention(il);
  float* tmp = ws_.tmp.get(size_t(T_ * E));
  for (int64_t i = 0; i < T_ * E; ++i) x[i] += tmp[i];
  dump("ffn_inp", il, x, T_ * E);
  norm_input(W.ffn_norm);
  dump("ffn_norm", il, ws_.a.get(0), T_ * E);
  if (L.is_moe)
    moe_ffn(il);
  else
    dense_ffn(il);
  dump("ffn_out", il, tmp, T_ * E);
  for (int64_t i = 0; i < T_ * E; ++i) x[i] += tmp[i];
}

void ForwardPass::run() {
  if (m_.experts_) m_.experts_->sync_weights(*weights_);
  prepare_batch();
  embed();
  for (int il = 0; il < hp_.n_layer; ++il) decoder_block(il);
  for (const SeqChunk& ch : chunks_) ch.seq->n_pos += ch.n_tokens;
  dump("h_nextn", -1, ws_.x.get(0), T_ * hp_.n_embd);
  head(m_.output_, m_.output_norm_);
}

void ForwardPass::run_mtp(int k, const float* h_in) {
  const int il = hp_.n_layer + k;
  const LayerWeights& W = weights_->layers[size_t(il)];
  kv_layer_base_ = il;
  collect_routing_ = false;
  if (m_.experts_) m_.experts_->sync_weights(*weights_);
  prepare_batch();
  // architecture.md "MTP heads": z = W_eh · [RMS(Emb(x); enorm) ; RMS(h_in; hnorm)] (the embedding
  // half first).
  const int64_t E = hp_.n_embd;
  const WeightMatrix& emb = W.nextn_embed_tokens.present() ? W.nextn_embed_tokens : m_.token_embd_;
  float* cat = ws_.a.get(size_t(T_ * 2 * E));
  float* e = ws_.tmp.get(size_t(T_ * E));
  int64_t t = 0;
  for (const SeqChunk& ch : chunks_)
    for (int32_t i = 0; i < ch.n_tokens; ++i, ++t) {
      // An image position's input is its image embedding here too (the trunk's input row).
      if (ch.tokens[i] < 0) std::copy_n(ch.embeddings + int64_t(i) * E, E, e + t * E);
      else dequantize_row(emb, ch.tokens[i], e + t * E);
    }
  for_each_row(T_, pool_, 16, [&](int64_t r) {
    rms_norm_row(e + r * E, W.nextn_enorm.data(), cat + r * 2 * E, E, hp_.rms_eps);
    rms_norm_row(h_in + r * E, W.nextn_hnorm.data(), cat + r * 2 * E + E, E, hp_.rms_eps);
  });
  ws_.acts.reset(cat, T_, 2 * E, 2 * E);
  ws_.jobs.clear();
  add_job(W.nextn_eh_proj, acts_for(W.nextn_eh_proj), ws_.x.get(size_t(T_ * E)), E);
  run_matmuls(ws_.jobs, pool_);
  decoder_block(il);
  for (const SeqChunk& ch : chunks_) ch.seq->n_pos += ch.n_tokens;
  // The block's own head when it has one, else the trunk's (architecture.md "MTP heads").
  head(W.nextn_shared_head_head.present() ? W.nextn_shared_head_head : m_.output_,
       W.nextn_shared_head_norm.empty() ? m_.output_norm_ : W.nextn_shared_head_norm);
}

// Row lookup, no scaling (architecture.md "Decoder block and output head").
void ForwardPass::embed() {
  const int64_t E = hp_.n_embd;
  float* x = ws_.x.get(size_t(T_ * E));
  int64_t t = 0;
  for (const SeqChunk& ch : chunks_)
    for (int32_t i = 0; i < ch.n_tokens; ++i, ++t) {
      if (ch.tokens[i] < 0) std::copy_n(ch.embeddings + int64_t(i) * E, E, x + t * E);  // checked: embeddings given
      else dequantize_row(m_.token_embd_, ch.tokens[i], x + t * E);
    }
}

AttentionLayer attention_layer(const HParams& hp, int il, size_t kv_layer) {
  const LayerHParams& L = hp.layers[size_t(il)];
  AttentionLayer al;
  al.kv_layer = kv_layer;
  al.n_head = L.n_head;
  al.n_head_kv = L.n_head_kv;
  al.head_dim_k = hp.head_dim_k;
  al.head_dim_v = hp.head_dim_v;
  al.is_swa = L.is_swa;
  al.window = hp.swa_window;
  return al;
}

// Attention (architecture.md "Attention"): projections, per-head Q/K RMSNorm, partial NeoX RoPE,
// K/V into the cache, causal (+ sliding window) softmax(QK)V over the cache, head-wise gate, W_o.
void ForwardPass::attention(int il) {
  const LayerHParams& L = hp_.layers[size_t(il)];
  const LayerWeights& W = weights_->layers[size_t(il)];
  const int64_t E = hp_.n_embd, H = L.n_head, G = L.n_head_kv, D = hp_.head_dim_k, Dv = hp_.head_dim_v;
  const int64_t T = T_;
  float* q = ws_.q.get(size_t(T * H * D));
  float* k = ws_.k.get(size_t(T * G * D));
  float* v = ws_.v.get(size_t(T * G * Dv));
  float* gate = ws_.gate.get(size_t(T * H));
  ws_.jobs.clear();
  add_job(W.attn_q, acts_for(W.attn_q), q, H * D);
  add_job(W.attn_k, acts_for(W.attn_k), k, G * D);
  add_job(W.attn_v, acts_for(W.attn_v), v, G * Dv);
  if (W.attn_gate.present()) add_job(W.attn_gate, acts_for(W.attn_gate), gate, H);
  run_matmuls(ws_.jobs, pool_);

  // Q/K norm + RoPE per token; then K and V go into the cache.
  const int32_t half = L.n_rot / 2;
  const float* rope = rope_table(L);
  for_each_row(T, pool_, 8, [&](int64_t t) {
    const float* cs = rope + t * 2 * half;
    const float* sn = cs + half;
    for (int64_t h = 0; h < H; ++h) {
      float* qh = q + (t * H + h) * D;
      if (!W.attn_q_norm.empty()) rms_norm_row(qh, W.attn_q_norm.data(), qh, D, hp_.rms_eps);
      rope_apply(qh, half, cs, sn);
    }
    for (int64_t g = 0; g < G; ++g) {
      float* kh = k + (t * G + g) * D;
      if (!W.attn_k_norm.empty()) rms_norm_row(kh, W.attn_k_norm.data(), kh, D, hp_.rms_eps);
      rope_apply(kh, half, cs, sn);
    }
  });
  dump("Qcur_pos", il, q, T * H * D);
  dump("Kcur_pos", il, k, T * G * D);
  dump("Vcur", il, v, T * G * Dv);

  // K and V into the cache (in its types), then causal (+ window) attention over it
  // (attention/attention.h: streaming softmax, split by tokens, KV head and span).
  const AttentionLayer al = attention_layer(hp_, il, kv_layer(il));
  AttentionBatch batch;
  batch.chunks = &chunks_;
  batch.n_tokens = T;
  batch.slot = slot_;
  batch.chunk_of = chunk_of_;
  store_kv(kv_, al, batch, k, v, pool_);
  float* o = ws_.o.get(size_t(T * H * Dv));
  attend(kv_, al, batch, q, o, pool_, ws_.attention);
  dump("attn_out", il, o, T * H * Dv);

  // architecture.md "Attention", step 7: the gate reads the attention input, one scalar per query
  // head.
  if (W.attn_gate.present()) {
    for (int64_t i = 0; i < T * H; ++i) gate[i] = sigmoid(gate[i]);
    dump("attn_gate_sigmoid", il, gate, T * H);
    for (int64_t th = 0; th < T * H; ++th) kernels::scale_f32(gate[th], o + th * Dv, Dv);
    dump("attn_gated", il, o, T * H * Dv);
  }
  ws_.o_acts.reset(o, T, H * Dv, H * Dv);
  ws_.jobs.clear();
  add_job(W.attn_output, ws_.o_acts.get(kernels::act_type(W.attn_output.type, prec_), pool_),
          ws_.tmp.get(size_t(T * E)), E);
  run_matmuls(ws_.jobs, pool_);
}

// Dense SwiGLU MLP; the shared clamp list governs dense layers (architecture.md "Dense MLP
// and the SwiGLU clamp").
void ForwardPass::dense_ffn(int il) {
  const LayerHParams& L = hp_.layers[size_t(il)];
  const LayerWeights& W = weights_->layers[size_t(il)];
  const int64_t E = hp_.n_embd, F = W.ffn_gate.n_out, T = T_;
  float* gu = ws_.gu.get(size_t(2 * T * F));
  ws_.jobs.clear();
  add_job(W.ffn_gate, acts_for(W.ffn_gate), gu, F);
  add_job(W.ffn_up, acts_for(W.ffn_up), gu + T * F, F);
  run_matmuls(ws_.jobs, pool_);
  const kernels::ActType at = kernels::act_type(W.ffn_down.type, prec_);
  const size_t stride = kernels::act_row_bytes(at, F);
  uint8_t* act = ws_.down_act.get(stride * size_t(T));
  for_each_row(T, pool_, 16, [&](int64_t t) {
    kernels::swiglu_convert(at, gu + t * F, gu + (T + t) * F, F, L.clamp_shexp, 1, F, act + size_t(t) * stride);
  });
  kernels::ActRows x;
  x.type = at;
  x.data = act;
  x.stride = stride;
  x.n_tok = T;
  ws_.jobs.clear();
  add_job(W.ffn_down, x, ws_.tmp.get(size_t(T * E)), E);
  run_matmuls(ws_.jobs, pool_);
}

// MoE (architecture.md "MoE routing and the shared expert"), in four named steps that pass their
// results explicitly: route (sigmoid router in F32, top-k by score + selection bias, unbiased
// weights renormalised and scaled), group the (token, expert) pairs by expert so each selected
// expert's weights are read once per batch, the expert products (every expert's gate/up products in
// one parallel section with the shared expert's, then every down product, the routed clamp applied
// in between), and the weighted combination plus the shared expert.
void ForwardPass::moe_ffn(int il) {
  const MoeRoute route = route_tokens(il);
  const ExpertGroups groups = group_by_expert(route);
  record_routing(il, route, groups);
  const ExpertOutputs outputs = expert_products(il, groups);
  combine_experts(il, route, groups, outputs);
}

ForwardPass::MoeRoute ForwardPass::route_tokens(int il) {
  const LayerHParams& L = hp_.layers[size_t(il)];
  const LayerWeights& W = weights_->layers[size_t(il)];
  const int64_t X = hp_.n_expert, K = L.n_expert_used, T = T_;
  float* logits = ws_.router.get(size_t(T * X));
  ws_.jobs.clear();
  add_job(W.ffn_gate_inp, acts_for(W.ffn_gate_inp), logits, X);
  run_matmuls(ws_.jobs, pool_);

  MoeRoute r;
  r.K = K;
  r.topk = ws_.moe_topk.get(size_t(T * K));
  r.n_kept = ws_.moe_topk_n.get(size_t(T));
  r.w_raw = ws_.moe_weights_raw.get(size_t(T * K));
  r.w = ws_.moe_weights.get(size_t(T * K));
  for_each_row(T, pool_, 32, [&](int64_t t) { route_token(W, t, logits + t * X, r); });
  if (opts_.dump) {
    std::vector<float> ids(r.topk, r.topk + T * K);
    dump("ffn_moe_topk", il, ids.data(), T * K);
    dump("ffn_moe_weights", il, r.w_raw, T * K);
    dump("ffn_moe_weights_scaled", il, r.w, T * K);
  }
  return r;
}

// One token's routing from its router logits p (turned into probabilities in place).
void ForwardPass::route_token(const LayerWeights& W, int64_t t, float* p, const MoeRoute& r) const {
  const int64_t X = hp_.n_expert, K = r.K;
  router_probabilities(hp_.gating_sigmoid, p, X);
  // Top-k by selection score (probability + bias); ties go to the lower expert id.
  int32_t* ids = r.topk + t * K;
  float sel_top[64];
  float* sel = K <= 64 ? sel_top : nullptr;
  thread_local std::vector<float> sel_big;
  if (!sel) {
    sel_big.resize(size_t(K));
    sel = sel_big.data();
  }
  router_top_k(p, W.exp_probs_b.empty() ? nullptr : W.exp_probs_b.data(), X, K, ids, sel);
  float* w_raw = r.w_raw + t * K;
  float sum = 0;
  for (int64_t k = 0; k < K; ++k) sum += (w_raw[k] = p[ids[k]]);
  int64_t keep = K;
  const RoutingPolicy& rp = chunks_[size_t(chunk_of_[t])].routing;
  if (rp.adaptive_mass > 0) {
    // Smallest top-ranked prefix whose normalised weight reaches the mass (lossy).
    const int64_t min_k = std::clamp<int64_t>(rp.adaptive_min_k, 1, K);
    float acc = 0;
    keep = 0;
    while (keep < K && (keep < min_k || acc < rp.adaptive_mass * sum)) acc += w_raw[keep++];
    if (keep < K) sum = acc;
  }
  r.n_kept[t] = int32_t(keep);
  const float norm = expert_weight_norm(hp_.expert_weights_norm, sum);
  for (int64_t k = 0; k < K; ++k) r.w[t * K + k] = k < keep ? w_raw[k] * norm * hp_.expert_weights_scale : 0.0f;
}

// The kept (token, slot) pairs grouped by expert: expert e's rows of the products are
// [first_row[e], first_row[e] + tokens[e].size()).
ForwardPass::ExpertGroups ForwardPass::group_by_expert(const MoeRoute& route) {
  const int64_t X = hp_.n_expert, K = route.K, T = T_;
  if (ws_.expert_tokens.size() < size_t(X)) {
    ws_.expert_tokens.resize(size_t(X));
    ws_.expert_slots.resize(size_t(X));
  }
  for (int64_t e = 0; e < X; ++e) ws_.expert_tokens[size_t(e)].clear(), ws_.expert_slots[size_t(e)].clear();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < route.n_kept[t]; ++k) {
      const int32_t e = route.topk[t * K + k];
      ws_.expert_tokens[size_t(e)].push_back(int32_t(t));
      ws_.expert_slots[size_t(e)].push_back(int32_t(t * K + k));
    }
  ExpertGroups g;
  g.tokens = &ws_.expert_tokens;
  g.slot_row = ws_.slot_row.get(size_t(T * K));
  g.first_row = ws_.expert_first_row.get(size_t(X));
  for (int64_t e = 0; e < X; ++e) {
    g.first_row[e] = g.n_rows;
    for (int32_t slot : ws_.expert_slots[size_t(e)]) g.slot_row[slot] = int32_t(g.n_rows++);
  }
  return g;
}

// The pass's routing statistics (entropy of the kept experts' normalised weights, expert
// counts, adaptive-policy use) and the expert-count observer (--record-experts).
void ForwardPass::record_routing(int il, const MoeRoute& route, const ExpertGroups& groups) {
  const int64_t X = hp_.n_expert, K = route.K, T = T_;
  RoutingStats scratch_stats;
  RoutingStats& rs = collect_routing_ ? out_.routing : scratch_stats;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t keep = route.n_kept[t];
    const float* w_raw = route.w_raw + t * K;
    float s = 0;
    for (int64_t k = 0; k < keep; ++k) s += w_raw[k];
    double h = 0;
    for (int64_t k = 0; k < keep && s > 0; ++k) {
      const double pk = double(w_raw[k]) / s;
      if (pk > 0) h -= pk * std::log(pk);
    }
    rs.entropy_sum += h;
    if (chunks_[size_t(chunk_of_[t])].routing.adaptive_mass > 0) {
      ++rs.adaptive_tokens;
      rs.adaptive_experts += keep;
    }
  }
  rs.token_layer_pairs += T;
  ++rs.n_moe_layers;
  if (!collect_routing_) moe_index_ = 0;
  rs.expert_counts.resize(size_t((moe_index_ + 1) * X), 0);
  int32_t* counts = rs.expert_counts.data() + moe_index_ * X;
  int64_t distinct = 0;
  for (int64_t e = 0; e < X; ++e) {
    const int64_t c = int64_t((*groups.tokens)[size_t(e)].size());
    counts[e] = int32_t(c);
    distinct += c > 0;
  }
  rs.distinct_experts_sum += distinct;
  if (m_.expert_observer_) m_.expert_observer_->observe(il, counts, X);
  ++moe_index_;
}

// Every routed expert's SwiGLU over its rows, and the shared expert's over every token.
// Expert parallelism: the other processes' experts are handed over first, so they compute
// while this one computes its own experts and the shared expert; their rows of `down`
// arrive at the end.
ForwardPass::ExpertOutputs ForwardPass::expert_products(int il, const ExpertGroups& groups) {
  const LayerWeights& W = weights_->layers[size_t(il)];
  ExpertExecutor* remote = m_.experts_;
  const std::vector<std::vector<int32_t>>* remote_rows = remote ? &remote_tokens(il, groups) : nullptr;
  if (remote) remote->begin(il, acts_for(W.ffn_gate_exps), *remote_rows, prec_);
  offload::ExpertCache::Lease in_memory;
  if (W.ffn_gate_exps.lazy || W.ffn_up_exps.lazy || W.ffn_down_exps.lazy || W.ffn_gate_exps.resident) {
    // Experts repacked on first use: make the copies of those this pass computes. Under a
    // memory budget: read those not in the expert cache, and keep them there until the end.
    std::vector<int32_t>& routed = ws_.routed_experts;
    routed.clear();
    for (int64_t e = 0; e < hp_.n_expert; ++e)
      if (!(*groups.tokens)[size_t(e)].empty() && computes_here(il, e) && !fully_replaced(il, e))
        routed.push_back(int32_t(e));
    in_memory = m_.prepare_experts(il, routed.data(), int64_t(routed.size()), pool_);
    if (m_.expert_cache_) prefetch_next_block(il);
  }
  const ExpertActs acts = expert_gate_up(il, groups);
  ExpertOutputs out = expert_down(il, groups, acts);
  if (remote) remote->finish(il, *remote_rows, groups.first_row, out.down);
  return out;
}

// Under a memory budget: the experts the next MoE block will probably route to, by its router
// applied to this block's FFN input (the residual stream changes little in one block), are
// read ahead on the cache's reader threads while this block computes. Only where experts go
// in memory changes, never a result.
void ForwardPass::prefetch_next_block(int il) {
  const int next = il + 1;
  if (next >= hp_.n_layer || !hp_.layers[size_t(next)].is_moe) return;
  const LayerWeights& W = weights_->layers[size_t(next)];
  const int64_t X = hp_.n_expert, K = hp_.layers[size_t(next)].n_expert_used, T = T_;
  float* logits = ws_.next_router.get(size_t(T * X));
  ws_.jobs.clear();
  add_job(W.ffn_gate_inp, acts_for(W.ffn_gate_inp), logits, X);
  run_matmuls(ws_.jobs, pool_);
  std::vector<uint8_t> wanted(static_cast<size_t>(X), 0);
  std::vector<int32_t> ids(static_cast<size_t>(K));
  std::vector<float> sel(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    router_probabilities(hp_.gating_sigmoid, logits + t * X, X);
    router_top_k(logits + t * X, W.exp_probs_b.empty() ? nullptr : W.exp_probs_b.data(), X, K, ids.data(), sel.data());
    for (int32_t e : ids) wanted[size_t(e)] = 1;
  }
  std::vector<int32_t>& predicted = ws_.predicted_experts;
  predicted.clear();
  for (int64_t e = 0; e < X; ++e)
    if (wanted[size_t(e)] && computes_here(next, e) && !fully_replaced(next, e)) predicted.push_back(int32_t(e));
  m_.expert_cache_->prefetch(next, predicted.data(), int64_t(predicted.size()));
}

// Replaced experts (model patches) of another type than their tensor run in this process
// even under expert parallelism: the other processes receive activations in the tensor's
// format.
bool ForwardPass::computes_here(int il, int64_t e) const {
  return !m_.experts_ || m_.experts_->is_local(il, int32_t(e)) || replaced_with_other_type(il, e);
}

// Whether all three matrices of expert e are replaced (model patches): nothing of the file's
// expert is read then.
bool ForwardPass::fully_replaced(int il, int64_t e) const {
  const LayerWeights& W = weights_->layers[size_t(il)];
  return W.ffn_gate_exps.replaced(e) && W.ffn_up_exps.replaced(e) && W.ffn_down_exps.replaced(e);
}

bool ForwardPass::replaced_with_other_type(int il, int64_t e) const {
  const LayerWeights& W = weights_->layers[size_t(il)];
  auto other = [e](const WeightMatrix& w) { return w.replaced(e) && w.matrix(e).type != w.type; };
  return other(W.ffn_gate_exps) || other(W.ffn_up_exps) || other(W.ffn_down_exps);
}

const std::vector<std::vector<int32_t>>& ForwardPass::remote_tokens(int il, const ExpertGroups& groups) {
  const LayerWeights& W = weights_->layers[size_t(il)];
  if (!W.ffn_gate_exps.slots && !W.ffn_up_exps.slots && !W.ffn_down_exps.slots) return *groups.tokens;
  ws_.remote_tokens = *groups.tokens;
  for (int64_t e = 0; e < hp_.n_expert; ++e)
    if (replaced_with_other_type(il, e)) ws_.remote_tokens[size_t(e)].clear();
  return ws_.remote_tokens;
}

// Gate/up products of every routed expert computed here and of the shared expert (one
// parallel section), then their SwiGLU straight into the down projections' input format.
ForwardPass::ExpertActs ForwardPass::expert_gate_up(int il, const ExpertGroups& groups) {
  const LayerHParams& L = hp_.layers[size_t(il)];
  const LayerWeights& W = weights_->layers[size_t(il)];
  const int64_t F = L.n_ff_exp, T = T_, n_rows = groups.n_rows;
  const bool has_shared = W.ffn_up_shexp.present();
  const int64_t FS = has_shared ? W.ffn_up_shexp.n_out : 0;
  float* gu = ws_.gu.get(size_t(2 * std::max<int64_t>(n_rows, 1) * F));
  float* sgu = ws_.shared_gu.get(size_t(std::max<int64_t>(2 * T * FS, 1)));
  ws_.jobs.clear();
  for (int64_t e = 0; e < hp_.n_expert; ++e) {
    const auto& toks = (*groups.tokens)[size_t(e)];
    if (toks.empty() || !computes_here(il, e)) continue;
    // Each matrix with the activations of its type (a replaced expert's may differ).
    const WeightMatrix wg = W.ffn_gate_exps.matrix(e), wu = W.ffn_up_exps.matrix(e);
    kernels::ActRows xg = acts_for(wg), xu = acts_for(wu);
    for (kernels::ActRows* x : {&xg, &xu}) {
      x->idx = toks.data();
      x->n_tok = int64_t(toks.size());
    }
    add_job(wg, xg, gu + groups.first_row[e] * F, F);
    add_job(wu, xu, gu + (n_rows + groups.first_row[e]) * F, F);
  }
  if (has_shared) {
    add_job(W.ffn_gate_shexp, acts_for(W.ffn_gate_shexp), sgu, FS);
    add_job(W.ffn_up_shexp, acts_for(W.ffn_up_shexp), sgu + T * FS, FS);
  }
  run_matmuls(ws_.jobs, pool_);

  ExpertActs a;
  a.type = kernels::act_type(W.ffn_down_exps.type, prec_);
  a.stride = kernels::act_row_bytes(a.type, F);
  if (W.ffn_down_exps.slots) {
    uint8_t* row_type = ws_.row_act_type.get(size_t(std::max<int64_t>(n_rows, 1)));
    std::fill_n(row_type, n_rows, uint8_t(a.type));
    for (int64_t e = 0; e < hp_.n_expert; ++e) {
      if (!W.ffn_down_exps.replaced(e) || (*groups.tokens)[size_t(e)].empty()) continue;
      const kernels::ActType te = kernels::act_type(W.ffn_down_exps.matrix(e).type, prec_);
      a.stride = std::max(a.stride, kernels::act_row_bytes(te, F));
      std::fill_n(row_type + groups.first_row[e], (*groups.tokens)[size_t(e)].size(), uint8_t(te));
    }
    a.row_type = row_type;
  }
  a.rows = ws_.down_act.get(a.stride * size_t(std::max<int64_t>(n_rows, 1)));
  uint8_t* row_local = nullptr;  // with remote experts: whether row r is computed here
  if (m_.experts_) {
    row_local = ws_.row_local.get(size_t(std::max<int64_t>(n_rows, 1)));
    for (int64_t e = 0; e < hp_.n_expert; ++e)
      std::fill_n(row_local + groups.first_row[e], (*groups.tokens)[size_t(e)].size(), uint8_t(computes_here(il, e)));
  }
  for_each_row(n_rows, pool_, 32, [&](int64_t r) {
    if (row_local && !row_local[r]) return;
    const kernels::ActType t = a.row_type ? kernels::ActType(a.row_type[r]) : a.type;
    kernels::swiglu_convert(t, gu + r * F, gu + (n_rows + r) * F, F, L.clamp_exp, 1, F, a.rows + size_t(r) * a.stride);
  });
  if (has_shared) {
    a.shared_type = kernels::act_type(W.ffn_down_shexp.type, prec_);
    a.shared_stride = kernels::act_row_bytes(a.shared_type, FS);
    a.shared = ws_.shared_act.get(a.shared_stride * size_t(T));
    for_each_row(T, pool_, 16, [&](int64_t t) {
      kernels::swiglu_convert(a.shared_type, sgu + t * FS, sgu + (T + t) * FS, FS, L.clamp_shexp, 1, FS,
                              a.shared + size_t(t) * a.shared_stride);
    });
  }
  return a;
}

// Down products of every routed expert computed here and of the shared expert (one
// parallel section): a row per (token, slot) pair, and one per token for the shared expert.
ForwardPass::ExpertOutputs ForwardPass::expert_down(int il, const ExpertGroups& groups, const ExpertActs& acts) {
  const LayerWeights& W = weights_->layers[size_t(il)];
  const int64_t E = hp_.n_embd, T = T_;
  ExpertOutputs out;
  out.down = ws_.down.get(size_t(std::max<int64_t>(groups.n_rows, 1) * E));
  ws_.jobs.clear();
  for (int64_t e = 0; e < hp_.n_expert; ++e) {
    const int64_t n = int64_t((*groups.tokens)[size_t(e)].size());
    if (n == 0 || !computes_here(il, e)) continue;
    kernels::ActRows x;
    x.type = acts.row_type ? kernels::ActType(acts.row_type[groups.first_row[e]]) : acts.type;
    x.data = acts.rows + size_t(groups.first_row[e]) * acts.stride;
    x.stride = acts.stride;
    x.n_tok = n;
    add_job(W.ffn_down_exps.matrix(e), x, out.down + groups.first_row[e] * E, E);
  }
  if (acts.shared) {
    out.shared = ws_.shared_out.get(size_t(T * E));
    kernels::ActRows x;
    x.type = acts.shared_type;
    x.data = acts.shared;
    x.stride = acts.shared_stride;
    x.n_tok = T;
    add_job(W.ffn_down_shexp, x, out.shared, E);
  }
  run_matmuls(ws_.jobs, pool_);
  return out;
}

// Weighted sum of each token's expert rows in top-k order (the order llama.cpp adds them
// in), then the shared expert's row; into ws.tmp, the FFN output.
void ForwardPass::combine_experts(int il, const MoeRoute& route, const ExpertGroups& groups,
                                  const ExpertOutputs& outputs) {
  const int64_t E = hp_.n_embd, K = route.K, T = T_;
  float* out = ws_.tmp.get(size_t(T * E));
  for_each_row(T, pool_, 16, [&](int64_t t) {
    float* o = out + t * E;
    std::fill(o, o + E, 0.0f);
    for (int64_t k = 0; k < route.n_kept[t]; ++k)
      kernels::axpy_f32(route.w[t * K + k], outputs.down + int64_t(groups.slot_row[t * K + k]) * E, o, E);
  });
  dump("ffn_moe_out", il, out, T * E);
  if (outputs.shared) {
    dump("ffn_shared_out", il, outputs.shared, T * E);
    for (int64_t i = 0; i < T * E; ++i) out[i] += outputs.shared[i];
  }
}

// architecture.md "Decoder block and output head": logits = W_out · RMS(h; output_norm) for the
// rows the chunks asked for; the pre-norm hidden rows for chunks that want them (the MTP input).
void ForwardPass::head(const WeightMatrix& w_out, const std::vector<float>& out_norm) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  const float* x = ws_.x.v.data();
  out_.logits_offset.assign(chunks_.size(), -1);
  out_.hidden_offset.assign(chunks_.size(), -1);
  thread_local std::vector<int32_t> row_storage;  // the lambdas below must see this thread's
  std::vector<int32_t>& rows = row_storage;
  rows.clear();
  int64_t t0 = 0, n_hidden = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const SeqChunk& ch = chunks_[c];
    if (ch.logits != LogitRows::None) {
      out_.logits_offset[c] = int32_t(rows.size());
      if (ch.logits == LogitRows::All)
        for (int32_t i = 0; i < ch.n_tokens; ++i) rows.push_back(int32_t(t0 + i));
      else
        rows.push_back(int32_t(t0 + ch.n_tokens - 1));
    }
    if (ch.want_hidden) {
      out_.hidden_offset[c] = int32_t(n_hidden);
      n_hidden += ch.n_tokens;
    }
    t0 += ch.n_tokens;
  }
  out_.hidden.resize(size_t(n_hidden * E));
  t0 = 0;
  for (const SeqChunk& ch : chunks_) {
    if (ch.want_hidden) {
      const int64_t off = out_.hidden_offset[size_t(&ch - chunks_.data())];
      std::memcpy(out_.hidden.data() + off * E, x + t0 * E, size_t(ch.n_tokens * E) * sizeof(float));
    }
    t0 += ch.n_tokens;
  }
  const int64_t n_out = int64_t(rows.size());
  out_.logits.resize(size_t(n_out * V));
  if (n_out == 0) return;
  float* normed = ws_.logits_in.get(size_t(n_out * E));
  for_each_row(n_out, pool_, 16,
               [&](int64_t r) { rms_norm_row(x + int64_t(rows[size_t(r)]) * E, out_norm.data(), normed + r * E, E, hp_.rms_eps); });
  dump("result_norm", -1, normed, n_out * E);
  ws_.final_acts.reset(normed, n_out, E, E);
  ws_.jobs.clear();
  add_job(w_out, ws_.final_acts.get(kernels::act_type(w_out.type, prec_), pool_), out_.logits.data(), V);
  run_matmuls(ws_.jobs, pool_);
}

}  // namespace step35
