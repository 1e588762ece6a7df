#include "train/training_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "attention/attention.h"
#include "exec/batch.h"
#include "exec/kv_cache.h"
#include "exec/thread_pool.h"
#include "tensor/kernels.h"
#include "train/linear.h"
#include "train/ops.h"

namespace step35::train {

void LossStats::add(const LossStats& o) {
  loss_sum += o.loss_sum;
  n_targets += o.n_targets;
  routed_loss_sum += o.routed_loss_sum;
  n_routed += o.n_routed;
  balance_loss += o.balance_loss;
  if (expert_counts.size() < o.expert_counts.size()) expert_counts.resize(o.expert_counts.size());
  for (size_t il = 0; il < o.expert_counts.size(); ++il) {
    auto& c = expert_counts[il];
    if (c.size() < o.expert_counts[il].size()) c.resize(o.expert_counts[il].size(), 0);
    for (size_t e = 0; e < o.expert_counts[il].size(); ++e) c[e] += o.expert_counts[il][e];
  }
}

namespace {

// A float buffer that grows to the largest size asked for and keeps its capacity.
struct Buf {
  std::vector<float> v;
  float* get(int64_t n) {
    if (int64_t(v.size()) < n) v.resize(size_t(n));
    return v.data();
  }
  float* zero(int64_t n) {
    float* p = get(n);
    std::fill(p, p + n, 0.0f);
    return p;
  }
};

// Runs fn(i) for i < n on the pool (work stealing), serially when the pool has one thread
// or the whole loop (`work`) is small.
template <typename Fn>
void for_each(int64_t n, ThreadPool& pool, double work, Fn&& fn) {
  if (n <= 1 || pool.n_threads() == 1 || work < kMinParallelWork) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  pool.parallel_stealing(n, [&](int64_t i, int) { fn(i); });
}

// Runs fn(b, e) over row ranges of [0, n) on the pool; `row_work`: the cost of one row.
template <typename Fn>
void for_rows(int64_t n, ThreadPool& pool, double row_work, Fn&& fn) {
  if (n < 2 || pool.n_threads() == 1 || double(n) * row_work < kMinParallelWork) {
    fn(int64_t(0), n);
    return;
  }
  pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
    if (b < e) fn(b, e);
  });
}

// Queries (or keys) per attention job: the unit the pool's threads take.
constexpr int64_t kAttnRows = 32;

// Multiply-adds of attention over n_seq sequences of s.n tokens.
double attention_work(const AttentionShape& s, int32_t n_seq) {
  const double keys = double(s.window > 0 ? std::min<int64_t>(s.window, s.n) : (s.n + 1) / 2);
  return double(n_seq) * double(s.n) * keys * double(s.H) * double(s.D + s.Dv);
}

}  // namespace

struct TrainingModel::State {
  const Model& m;
  const HParams& hp;
  const TrainedParams* params;
  ThreadPool& pool;
  TrainingOptions opts;

  // Batch geometry.
  int32_t B = 0, C = 0;
  int64_t T = 0;
  std::vector<int32_t> positions;  // 0..C-1

  // Rope tables per rotary setting (n_rot, base, factors), C positions each.
  struct Rope {
    int32_t n_rot;
    float base;
    bool freqs;
    std::vector<float> table;
  };
  std::vector<Rope> ropes;

  // Checkpoints: the input of each layer from the lowest trained one up.
  std::vector<Buf> ckpt;
  Buf x, x_next, dx, dx_next;

  // One layer's intermediates (reused by every layer; rebuilt when a layer is recomputed).
  Buf a, inv_a, q, qr, inv_q, k, kr, inv_k, v, graw, o, lse, og, ao, h1, f, inv_f, y;
  // dense FFN
  Buf dg, du, dact;  // (gradients; also used by MoE and the shared expert)
  Buf gate, up, act;
  // MoE
  Buf z, p, w, rgate, rup, ract, rdown, sgate, sup, sact, sout;
  std::vector<int32_t> ids, row_token, row_slot, slot_row;
  std::vector<int64_t> expert_first;  // n_expert + 1 row offsets
  std::vector<int32_t> active_experts;
  // Backward scratch
  Buf dh1, df, dog, d_o, dgraw, dqr, dkr, dv, dq, dk, da, dz, dw, drow, dsact, dsg, dsu;
  // Head
  Buf normed, inv_out, logits, dlogits, dnormed;
  std::vector<double> row_loss;
  std::vector<uint8_t> routed;  // per token: top-k includes a trained expert somewhere
  int layer_in_buffers = -1;    // the layer whose intermediates the buffers hold

  // The inference forward's attention (attention/attention.h) over an F32 cache holding
  // the batch's sequences: the training forward's attention output is the engine's, bit for
  // bit, at every ISA level and thread count (a separate softmax here agreed only to a few
  // ulps, which the Native forward's 8-bit rounding of the next activations can turn into
  // another expert choice). The backward keeps its own scores and log-sum-exp.
  struct EngineAttention {
    std::vector<KvLayerShape> shapes;  // one cache layer per distinct attention shape
    std::vector<size_t> layer_of;      // model layer -> cache layer
    std::unique_ptr<KvPool> kv;
    std::vector<KvSeq> seqs;
    std::vector<SeqChunk> chunks;
    std::vector<int32_t> slot, chunk_of;
    std::vector<float> k_copy, v_copy;  // store_kv may rotate what it is given in place
    AttentionScratch scratch;
    int32_t B = 0, C = 0;
  } engine_attention;

  State(const Model& model, const TrainedParams* p, ThreadPool& tp, TrainingOptions o)
      : m(model), hp(model.hparams()), params(p), pool(tp), opts(o) {}

  uint64_t bytes() const {
    uint64_t n = 0;
    for (const Buf* b : {&x, &x_next, &dx, &dx_next, &a, &inv_a, &q, &qr, &inv_q, &k, &kr, &inv_k, &v, &graw, &o,
                         &lse, &og, &ao, &h1, &f, &inv_f, &y, &dg, &du, &dact, &gate, &up, &act, &z, &p, &w, &rgate,
                         &rup, &ract, &rdown, &sgate, &sup, &sact, &sout, &dh1, &df, &dog, &d_o, &dgraw, &dqr, &dkr,
                         &dv, &dq, &dk, &da, &dz, &dw, &drow, &dsact, &dsg, &dsu, &normed, &inv_out, &logits,
                         &dlogits, &dnormed})
      n += b->v.capacity() * sizeof(float);
    for (const Buf& b : ckpt) n += b.v.capacity() * sizeof(float);
    return n;
  }

  void set_geometry(int32_t n_seq, int32_t n_ctx) {
    B = n_seq;
    C = n_ctx;
    T = int64_t(n_seq) * n_ctx;
    if (int32_t(positions.size()) != C) {
      positions.resize(size_t(C));
      for (int32_t i = 0; i < C; ++i) positions[size_t(i)] = i;
      ropes.clear();
    }
  }

  // The cache of engine_attention for the current geometry (B sequences of C positions).
  EngineAttention& attention_cache() {
    EngineAttention& ea = engine_attention;
    if (ea.kv && ea.B == B && ea.C == C) return ea;
    ea.kv.reset();
    ea.shapes.clear();
    ea.layer_of.clear();
    for (const LayerHParams& L : hp.layers) {
      const KvLayerShape shape{L.is_swa, L.n_head_kv, hp.head_dim_k, hp.head_dim_v};
      size_t i = 0;
      while (i < ea.shapes.size() && !(ea.shapes[i].is_swa == shape.is_swa && ea.shapes[i].n_head_kv == shape.n_head_kv))
        ++i;
      if (i == ea.shapes.size()) ea.shapes.push_back(shape);
      ea.layer_of.push_back(i);
    }
    const int64_t blocks = int64_t(B) * ((C + KvPool::kDefaultBlockSize - 1) / KvPool::kDefaultBlockSize);
    ea.kv = std::make_unique<KvPool>(ea.shapes, hp.swa_window, KvPool::kDefaultBlockSize, blocks, blocks, 0,
                                     KvTypes::f32());
    ea.seqs.assign(size_t(B), KvSeq{});
    ea.chunks.assign(size_t(B), SeqChunk{});
    ea.slot.resize(size_t(T));
    ea.chunk_of.resize(size_t(T));
    for (int32_t b = 0; b < B; ++b) {
      if (!ea.kv->reserve(ea.seqs[size_t(b)], C)) throw std::logic_error("training attention: cache too small");
      ea.chunks[size_t(b)].seq = &ea.seqs[size_t(b)];
      ea.chunks[size_t(b)].n_tokens = C;
      for (int32_t i = 0; i < C; ++i) {
        ea.slot[size_t(int64_t(b) * C + i)] = i;
        ea.chunk_of[size_t(int64_t(b) * C + i)] = b;
      }
    }
    ea.B = B;
    ea.C = C;
    return ea;
  }

  const float* rope(const LayerHParams& L) {
    for (const Rope& r : ropes)
      if (r.n_rot == L.n_rot && r.base == L.rope_base && r.freqs == L.use_rope_freqs) return r.table.data();
    const float* ff = L.use_rope_freqs && !m.rope_freqs().empty() ? m.rope_freqs().data() : nullptr;
    ropes.push_back({L.n_rot, L.rope_base, L.use_rope_freqs, rope_table(positions.data(), C, L.n_rot, L.rope_base, ff)});
    return ropes.back().table.data();
  }

  RouterConfig router_config(const LayerHParams& L) const {
    RouterConfig c;
    c.n_expert = hp.n_expert;
    c.k = L.n_expert_used;
    c.sigmoid = hp.gating_sigmoid;
    c.normalize = hp.expert_weights_norm;
    c.scale = hp.expert_weights_scale;
    return c;
  }

  int32_t balance_groups() const {
    const int32_t G = opts.balance_groups > 0 ? opts.balance_groups : hp.n_expert;
    if (G <= 0 || hp.n_expert % G != 0)
      throw std::invalid_argument("balance groups: " + std::to_string(G) + " does not divide the " +
                                  std::to_string(hp.n_expert) + " experts");
    return G;
  }

  // The matrices the forward pass multiplies: a trained F32 copy where there is one.
  WeightMatrix expert_matrix(int il, int32_t e, TrainedParams::Matrix which) const {
    if (params)
      if (const TrainedTensor* t = params->expert(il, e, which)) return t->matrix();
    const LayerWeights& W = m.layer(il);
    const WeightMatrix& w3 = which == TrainedParams::Gate ? W.ffn_gate_exps
                             : which == TrainedParams::Up ? W.ffn_up_exps
                                                          : W.ffn_down_exps;
    return w3.matrix(e);
  }
  WeightMatrix shared_matrix(int il, TrainedParams::Matrix which) const {
    if (params)
      if (const TrainedTensor* t = params->shared(il, which)) return t->matrix();
    const LayerWeights& W = m.layer(il);
    return which == TrainedParams::Gate ? W.ffn_gate_shexp : which == TrainedParams::Up ? W.ffn_up_shexp
                                                                                      : W.ffn_down_shexp;
  }
  WeightMatrix router_matrix(int il) const {
    if (params)
      if (const TrainedTensor* t = params->router(il)) return t->matrix();
    return m.layer(il).ffn_gate_inp;
  }

  // ---------------------------------------------------------------------------------
  // Forward

  void dump(const char* name, int layer, const float* data, int64_t n) const {
    if (opts.dump) opts.dump(name, layer, data, n);
  }

  void embed(const std::vector<int32_t>& tokens, float* out) {
    const int64_t E = hp.n_embd;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t id = tokens[size_t(t)];
      if (id < 0 || id >= hp.n_vocab)
        throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                                std::to_string(hp.n_vocab - 1) + ")");
      dequantize_row(m.token_embd(), id, out + t * E);
    }
  }

  void rms_rows(const float* in, const std::vector<float>& w, float* out, float* inv, int64_t rows, int64_t n) {
    for_rows(rows, pool, double(n) * 4, [&](int64_t b, int64_t e) {
      rms_norm_forward(in + b * n, w.data(), out + b * n, inv + b, e - b, n, hp.rms_eps);
    });
  }

  // Attention (architecture.md "Attention") on a = RMS(x); writes ao (before the residual add).
  void attention_forward_layer(int il, const float* x) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const LayerWeights& W = m.layer(il);
    const int64_t E = hp.n_embd, H = L.n_head, G = L.n_head_kv, D = hp.head_dim_k, Dv = hp.head_dim_v;
    float* pa = a.get(T * E);
    dump("attn_norm_in", il, x, T * E);
    rms_rows(x, W.attn_norm, pa, inv_a.get(T), T, E);
    dump("attn_norm", il, pa, T * E);
    float* pq = q.get(T * H * D);
    float* pk = k.get(T * G * D);
    float* pv = v.get(T * G * Dv);
    linear_forward(W.attn_q, pa, E, T, pq, H * D, &pool, opts.precision);
    linear_forward(W.attn_k, pa, E, T, pk, G * D, &pool, opts.precision);
    linear_forward(W.attn_v, pa, E, T, pv, G * Dv, &pool, opts.precision);
    float* pg = graw.get(T * H);
    if (W.attn_gate.present()) linear_forward(W.attn_gate, pa, E, T, pg, H, &pool, opts.precision);
    // Per-head Q/K RMSNorm, then RoPE.
    float* pqr = qr.get(T * H * D);
    float* pkr = kr.get(T * G * D);
    float* piq = inv_q.get(T * H);
    float* pik = inv_k.get(T * G);
    if (!W.attn_q_norm.empty())
      rms_rows(pq, W.attn_q_norm, pqr, piq, T * H, D);
    else
      std::memcpy(pqr, pq, size_t(T * H * D) * sizeof(float));
    if (!W.attn_k_norm.empty())
      rms_rows(pk, W.attn_k_norm, pkr, pik, T * G, D);
    else
      std::memcpy(pkr, pk, size_t(T * G * D) * sizeof(float));
    const float* tab = rope(L);
    for (int32_t b = 0; b < B; ++b) {
      rope_forward(pqr + int64_t(b) * C * H * D, C, H, D, L.n_rot / 2, tab);
      rope_forward(pkr + int64_t(b) * C * G * D, C, G, D, L.n_rot / 2, tab);
    }
    dump("Qcur_pos", il, pqr, T * H * D);
    dump("Kcur_pos", il, pkr, T * G * D);
    dump("Vcur", il, pv, T * G * Dv);
    AttentionShape s{C, H, G, D, Dv, L.is_swa ? hp.swa_window : 0};
    float* po = o.get(T * H * Dv);
    float* pl = lse.get(T * H);
    // The output: the engine's attention (see EngineAttention). It stores the keys and
    // values it is given: copies, since pkr and pv are kept for the backward.
    EngineAttention& ea = attention_cache();
    const AttentionLayer al = attention_layer(hp, il, ea.layer_of[size_t(il)]);
    AttentionBatch batch;
    batch.chunks = &ea.chunks;
    batch.n_tokens = T;
    batch.slot = ea.slot.data();
    batch.chunk_of = ea.chunk_of.data();
    ea.k_copy.assign(pkr, pkr + T * G * D);
    ea.v_copy.assign(pv, pv + T * G * Dv);
    store_kv(*ea.kv, al, batch, ea.k_copy.data(), ea.v_copy.data(), pool);
    attend(*ea.kv, al, batch, pqr, po, pool, ea.scratch);
    // The log-sum-exp of every score row, for the backward. Jobs of (sequence, KV head,
    // block of queries); later blocks see more keys, the pool balances them by stealing.
    const int64_t nb = (C + kAttnRows - 1) / kAttnRows;
    for_each(int64_t(B) * G * nb, pool, attention_work(s, B), [&](int64_t job) {
      const int64_t b = job / (G * nb), g = job / nb % G, r0 = job % nb * kAttnRows, t0 = b * C;
      attention_forward(s, pqr + t0 * H * D, pkr + t0 * G * D, nullptr, nullptr, pl + t0 * H, g, r0,
                        std::min<int64_t>(C, r0 + kAttnRows));
    });
    dump("attn_out", il, po, T * H * Dv);
    float* pog = og.get(T * H * Dv);
    if (W.attn_gate.present())
      head_gate_forward(pg, po, pog, T, H, Dv);
    else
      std::memcpy(pog, po, size_t(T * H * Dv) * sizeof(float));
    if (W.attn_gate.present()) dump("attn_gated", il, pog, T * H * Dv);
    linear_forward(W.attn_output, pog, H * Dv, T, ao.get(T * E), E, &pool, opts.precision);
  }

  // Dense SwiGLU MLP (architecture.md "Dense MLP and the SwiGLU clamp") on f; writes y.
  void dense_forward(int il) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const LayerWeights& W = m.layer(il);
    const int64_t E = hp.n_embd, F = W.ffn_gate.n_out;
    float* pg = gate.get(T * F);
    float* pu = up.get(T * F);
    linear_forward(W.ffn_gate, f.v.data(), E, T, pg, F, &pool, opts.precision);
    linear_forward(W.ffn_up, f.v.data(), E, T, pu, F, &pool, opts.precision);
    float* pa = act.get(T * F);
    for_rows(T, pool, double(F) * 8, [&](int64_t b, int64_t e) {
      swiglu_forward(pg + b * F, pu + b * F, F, L.clamp_shexp, e - b, F, pa + b * F);
    });
    linear_forward(W.ffn_down, pa, F, T, y.get(T * E), E, &pool, opts.precision);
  }

  // MoE (architecture.md "MoE routing and the shared expert") on f; writes y. Records routing
  // statistics into `stats` when given.
  void moe_forward(int il, LossStats* stats) {
    route_tokens(il);
    group_by_expert(il);
    if (stats) record_routing(il, stats);
    routed_experts_forward(il);
    const float* ps = shared_expert_forward(il);
    dump("ffn_moe_weights_scaled", il, w.v.data(), T * hp.layers[size_t(il)].n_expert_used);
    if (ps) dump("ffn_shared_out", il, ps, T * hp.n_embd);
    combine_experts(il, ps);
  }

  // The router on f: logits z, probabilities p, and per token its top-k experts (ids) and
  // their weights (w).
  void route_tokens(int il) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const LayerWeights& W = m.layer(il);
    const int64_t E = hp.n_embd, X = hp.n_expert, K = L.n_expert_used;
    const RouterConfig rc = router_config(L);
    float* pz = z.get(T * X);
    linear_forward(router_matrix(il), f.v.data(), E, T, pz, X, &pool, opts.precision);
    float* pp = p.get(T * X);
    ids.resize(size_t(T * K));
    float* pw = w.get(T * K);
    const float* bias = W.exp_probs_b.empty() ? nullptr : W.exp_probs_b.data();
    for_rows(T, pool, double(X) * 8, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) router_forward(rc, pz + t * X, bias, pp + t * X, ids.data() + t * K, pw + t * K);
    });
  }

  // The (token, slot) rows grouped by expert, tokens in order within an expert (as the
  // forward pass does): expert_first, row_token, row_slot, slot_row and active_experts.
  void group_by_expert(int il) {
    const int64_t X = hp.n_expert, K = hp.layers[size_t(il)].n_expert_used, R = T * K;
    expert_first.assign(size_t(X + 1), 0);
    for (int64_t i = 0; i < T * K; ++i) ++expert_first[size_t(ids[size_t(i)] + 1)];
    for (int64_t e = 0; e < X; ++e) expert_first[size_t(e + 1)] += expert_first[size_t(e)];
    row_token.resize(size_t(R));
    row_slot.resize(size_t(R));
    slot_row.resize(size_t(R));
    std::vector<int64_t> fill(expert_first.begin(), expert_first.end() - 1);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t kk = 0; kk < K; ++kk) {
        const int32_t e = ids[size_t(t * K + kk)];
        const int64_t r = fill[size_t(e)]++;
        row_token[size_t(r)] = int32_t(t);
        row_slot[size_t(r)] = int32_t(t * K + kk);
        slot_row[size_t(t * K + kk)] = int32_t(r);
      }
    active_experts.clear();
    for (int64_t e = 0; e < X; ++e)
      if (expert_first[size_t(e + 1)] > expert_first[size_t(e)]) active_experts.push_back(int32_t(e));
  }

  // Expert counts, the top-k choices when asked for, the tokens routed to a trained expert
  // and the balance loss at a trained router.
  void record_routing(int il, LossStats* stats) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const int64_t X = hp.n_expert, K = L.n_expert_used;
    auto& counts = stats->expert_counts[size_t(il)];
    counts.assign(size_t(X), 0);
    for (int64_t e = 0; e < X; ++e) counts[size_t(e)] = expert_first[size_t(e + 1)] - expert_first[size_t(e)];
    if (opts.record_topk) stats->topk[size_t(il)].assign(ids.begin(), ids.end());
    if (params && params->layer_has_experts(il))
      for (int64_t t = 0; t < T; ++t)
        for (int64_t kk = 0; kk < K; ++kk)
          if (params->is_trained_expert(il, ids[size_t(t * K + kk)])) routed[size_t(t)] = 1;
    if (params && params->router(il))
      stats->balance_loss += balance_loss(router_config(L), balance_groups(), p.v.data(), ids.data(), T, 0.0f, nullptr);
  }

  // Routed experts: gate/up, SwiGLU, down, per expert on the pool (rows of rgate, rup, ract, rdown).
  void routed_experts_forward(int il) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const int64_t E = hp.n_embd, F = L.n_ff_exp, R = T * L.n_expert_used;
    const float* pf = f.v.data();
    float* prg = rgate.get(R * F);
    float* pru = rup.get(R * F);
    float* pra = ract.get(R * F);
    float* prd = rdown.get(R * E);
    for_each(int64_t(active_experts.size()), pool, double(R) * double(F) * double(E) * 3, [&](int64_t i) {
      thread_local std::vector<float> xs;
      const int32_t e = active_experts[size_t(i)];
      const int64_t r0 = expert_first[size_t(e)], n = expert_first[size_t(e + 1)] - r0;
      xs.resize(size_t(n * E));
      for (int64_t j = 0; j < n; ++j)
        std::memcpy(xs.data() + j * E, pf + int64_t(row_token[size_t(r0 + j)]) * E, size_t(E) * sizeof(float));
      const Precision pr = opts.precision;
      linear_forward(expert_matrix(il, e, TrainedParams::Gate), xs.data(), E, n, prg + r0 * F, F, nullptr, pr);
      linear_forward(expert_matrix(il, e, TrainedParams::Up), xs.data(), E, n, pru + r0 * F, F, nullptr, pr);
      swiglu_forward(prg + r0 * F, pru + r0 * F, F, L.clamp_exp, n, F, pra + r0 * F);
      linear_forward(expert_matrix(il, e, TrainedParams::Down), pra + r0 * F, F, n, prd + r0 * E, E, nullptr, pr);
    });
  }

  // The shared expert on f (sgate, sup, sact, sout): its output, or null where the layer has none.
  const float* shared_expert_forward(int il) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const LayerWeights& W = m.layer(il);
    if (!W.ffn_up_shexp.present()) return nullptr;
    const int64_t E = hp.n_embd, FS = W.ffn_up_shexp.n_out;
    const float* pf = f.v.data();
    float* psg = sgate.get(T * FS);
    float* psu = sup.get(T * FS);
    linear_forward(shared_matrix(il, TrainedParams::Gate), pf, E, T, psg, FS, &pool, opts.precision);
    linear_forward(shared_matrix(il, TrainedParams::Up), pf, E, T, psu, FS, &pool, opts.precision);
    float* psa = sact.get(T * FS);
    for_rows(T, pool, double(FS) * 8, [&](int64_t b, int64_t e) {
      swiglu_forward(psg + b * FS, psu + b * FS, FS, L.clamp_shexp, e - b, FS, psa + b * FS);
    });
    float* ps = sout.get(T * E);
    linear_forward(shared_matrix(il, TrainedParams::Down), psa, FS, T, ps, E, &pool, opts.precision);
    return ps;
  }

  // y: the routed experts' rows weighted in top-k order, then the shared expert's output
  // `ps` when there is one (the forward pass's order).
  void combine_experts(int il, const float* ps) {
    const int64_t E = hp.n_embd, K = hp.layers[size_t(il)].n_expert_used;
    const float* pw = w.v.data();
    const float* prd = rdown.v.data();
    float* py = y.get(T * E);
    for_rows(T, pool, double(E * K), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        float* yt = py + t * E;
        std::fill(yt, yt + E, 0.0f);
        for (int64_t kk = 0; kk < K; ++kk)
          kernels::axpy_f32(pw[t * K + kk], prd + int64_t(slot_row[size_t(t * K + kk)]) * E, yt, E);
        if (ps)
          for (int64_t i = 0; i < E; ++i) yt[i] += ps[t * E + i];
      }
    });
  }

  // One decoder block (architecture.md "Decoder block and output head"): out = h1 + FFN(RMS(h1)),
  // h1 = x + Attention(RMS(x)).
  void forward_layer(int il, const float* x_in, float* out, LossStats* stats) {
    layer_in_buffers = il;
    const LayerHParams& L = hp.layers[size_t(il)];
    const LayerWeights& W = m.layer(il);
    const int64_t E = hp.n_embd;
    attention_forward_layer(il, x_in);
    float* ph1 = h1.get(T * E);
    const float* pao = ao.v.data();
    for (int64_t i = 0; i < T * E; ++i) ph1[i] = x_in[i] + pao[i];
    dump("ffn_inp", il, ph1, T * E);
    rms_rows(ph1, W.ffn_norm, f.get(T * E), inv_f.get(T), T, E);
    dump("ffn_norm", il, f.v.data(), T * E);
    if (L.is_moe)
      moe_forward(il, stats);
    else
      dense_forward(il);
    const float* py = y.v.data();
    dump("ffn_out", il, py, T * E);
    for (int64_t i = 0; i < T * E; ++i) out[i] = ph1[i] + py[i];
  }

  // ---------------------------------------------------------------------------------
  // Backward

  // Given dout (gradient of the layer's output, in dx), writes the gradient of its input
  // to dx_next when need_dx, and adds the trained tensors' gradients. The layer's
  // intermediates must be those of its forward (recomputed just before).
  void backward_layer(int il, const float* x_in, const float* dout, float* dx_in, bool need_dx,
                      TrainedParams* grads) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const LayerWeights& W = m.layer(il);
    const int64_t E = hp.n_embd;
    // FFN: out = h1 + FFN(f), f = RMS(h1).
    float* pdf = need_dx ? df.zero(T * E) : nullptr;
    if (L.is_moe)
      moe_backward(il, dout, pdf, grads);
    else if (need_dx)
      dense_backward(il, dout, pdf);
    if (!need_dx) return;
    float* pdh1 = dh1.get(T * E);
    std::memcpy(pdh1, dout, size_t(T * E) * sizeof(float));
    for_rows(T, pool, double(E) * 6, [&](int64_t b, int64_t e) {
      rms_norm_backward(h1.v.data() + b * E, W.ffn_norm.data(), inv_f.v.data() + b, pdf + b * E, pdh1 + b * E, e - b,
                        E, true);
    });
    attention_backward_layer(il, x_in, pdh1, dx_in);
  }

  void dense_backward(int il, const float* dy, float* df_out) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const LayerWeights& W = m.layer(il);
    const int64_t E = hp.n_embd, F = W.ffn_gate.n_out;
    float* pda = dact.zero(T * F);
    linear_backward_input(W.ffn_down, dy, E, T, pda, F, &pool);
    float* pdg = dg.get(T * F);
    float* pdu = du.get(T * F);
    for_rows(T, pool, double(F) * 10, [&](int64_t b, int64_t e) {
      swiglu_backward(gate.v.data() + b * F, up.v.data() + b * F, F, L.clamp_shexp, e - b, F, pda + b * F,
                      pdg + b * F, pdu + b * F);
    });
    linear_backward_input(W.ffn_gate, pdg, F, T, df_out, E, &pool);
    linear_backward_input(W.ffn_up, pdu, F, T, df_out, E, &pool);
  }

  // What an MoE layer's backward is given and asked for.
  struct MoeGrad {
    const float* dy;       // gradient of the FFN's output
    float* df_out;         // += gradient of its input f; null when not needed
    TrainedParams* grads;  // += the trained tensors' gradients; null when none
    bool need_router;      // the router's backward runs (for df_out or a trained router)
  };

  void moe_backward(int il, const float* dy, float* df_out, TrainedParams* grads) {
    const bool router_trained = grads && grads->router(il);
    const MoeGrad g{dy, df_out, grads, df_out || router_trained};
    if (m.layer(il).ffn_up_shexp.present()) shared_expert_backward(il, g);
    routed_experts_backward(il, g);
    if (g.need_router) moe_router_backward(il, g);
  }

  void shared_expert_backward(int il, const MoeGrad& g) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const LayerWeights& W = m.layer(il);
    TrainedTensor* tg = g.grads ? g.grads->shared(il, TrainedParams::Gate) : nullptr;
    TrainedTensor* tu = g.grads ? g.grads->shared(il, TrainedParams::Up) : nullptr;
    TrainedTensor* td = g.grads ? g.grads->shared(il, TrainedParams::Down) : nullptr;
    if (!g.df_out && !tg && !tu && !td) return;
    const int64_t E = hp.n_embd, FS = W.ffn_up_shexp.n_out;
    const float* pf = f.v.data();
    float* pda = dsact.zero(T * FS);
    linear_backward_input(shared_matrix(il, TrainedParams::Down), g.dy, E, T, pda, FS, &pool);
    if (td) linear_backward_weight(sact.v.data(), FS, g.dy, E, T, FS, E, td->grad.data(), &pool);
    float* pdg = dsg.get(T * FS);
    float* pdu = dsu.get(T * FS);
    for_rows(T, pool, double(FS) * 10, [&](int64_t b, int64_t e) {
      swiglu_backward(sgate.v.data() + b * FS, sup.v.data() + b * FS, FS, L.clamp_shexp, e - b, FS, pda + b * FS,
                      pdg + b * FS, pdu + b * FS);
    });
    if (tg) linear_backward_weight(pf, E, pdg, FS, T, E, FS, tg->grad.data(), &pool);
    if (tu) linear_backward_weight(pf, E, pdu, FS, T, E, FS, tu->grad.data(), &pool);
    if (g.df_out) {
      linear_backward_input(shared_matrix(il, TrainedParams::Gate), pdg, FS, T, g.df_out, E, &pool);
      linear_backward_input(shared_matrix(il, TrainedParams::Up), pdu, FS, T, g.df_out, E, &pool);
    }
  }

  // Routed experts, one job per expert (expert_backward): the routing weights' gradients
  // into dw, the trained experts' gradients, and each row's input gradient into drow, added
  // to df_out per token.
  void routed_experts_backward(int il, const MoeGrad& g) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const int64_t E = hp.n_embd, K = L.n_expert_used, F = L.n_ff_exp, R = T * K;
    dw.zero(R);
    float* pdrow = g.df_out ? drow.get(R * E) : nullptr;
    bool any_expert_work = g.df_out || g.need_router;
    if (g.grads)
      for (int32_t e : active_experts) any_expert_work = any_expert_work || g.grads->is_trained_expert(il, e);
    if (any_expert_work)
      for_each(int64_t(active_experts.size()), pool, double(R) * double(F) * double(E) * 6,
               [&](int64_t i) { expert_backward(il, active_experts[size_t(i)], g); });
    if (g.df_out)
      for_rows(T, pool, double(E * K), [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t)
          for (int64_t kk = 0; kk < K; ++kk)
            kernels::axpy_f32(1.0f, pdrow + int64_t(slot_row[size_t(t * K + kk)]) * E, g.df_out + t * E, E);
      });
  }

  // Expert e's rows r = (token t, slot): dL/d act_r = w_r · W_down^T dy_t and
  // dL/dw_r = (W_down^T dy_t) · act_r.
  void expert_backward(int il, int32_t e, const MoeGrad& g) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const int64_t E = hp.n_embd, F = L.n_ff_exp;
    TrainedTensor* tg = g.grads ? g.grads->expert(il, e, TrainedParams::Gate) : nullptr;
    TrainedTensor* tu = g.grads ? g.grads->expert(il, e, TrainedParams::Up) : nullptr;
    TrainedTensor* td = g.grads ? g.grads->expert(il, e, TrainedParams::Down) : nullptr;
    if (!g.df_out && !g.need_router && !tg) return;
    const int64_t r0 = expert_first[size_t(e)], n = expert_first[size_t(e + 1)] - r0;
    const float* pw = w.v.data();
    thread_local std::vector<float> dys, gdown, dgs, dus, xs;
    dys.resize(size_t(n * E));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t t = row_token[size_t(r0 + j)];
      std::memcpy(dys.data() + j * E, g.dy + t * E, size_t(E) * sizeof(float));
    }
    gdown.assign(size_t(n * F), 0.0f);
    linear_backward_input(expert_matrix(il, e, TrainedParams::Down), dys.data(), E, n, gdown.data(), F, nullptr);
    const float* pa = ract.v.data() + r0 * F;
    for (int64_t j = 0; j < n; ++j) {
      const int32_t slot = row_slot[size_t(r0 + j)];
      dw.v[size_t(slot)] = kernels::dot_f32(gdown.data() + j * F, pa + j * F, F);
    }
    if (!g.df_out && !tg) return;  // only the router needed this expert
    if (td) {
      for (int64_t j = 0; j < n; ++j) kernels::scale_f32(pw[row_slot[size_t(r0 + j)]], dys.data() + j * E, E);
      linear_backward_weight(pa, F, dys.data(), E, n, F, E, td->grad.data(), nullptr);
    }
    for (int64_t j = 0; j < n; ++j) kernels::scale_f32(pw[row_slot[size_t(r0 + j)]], gdown.data() + j * F, F);
    dgs.resize(size_t(n * F));
    dus.resize(size_t(n * F));
    swiglu_backward(rgate.v.data() + r0 * F, rup.v.data() + r0 * F, F, L.clamp_exp, n, F, gdown.data(), dgs.data(),
                    dus.data());
    if (tg || tu) {
      xs.resize(size_t(n * E));
      for (int64_t j = 0; j < n; ++j)
        std::memcpy(xs.data() + j * E, f.v.data() + int64_t(row_token[size_t(r0 + j)]) * E, size_t(E) * sizeof(float));
      if (tg) linear_backward_weight(xs.data(), E, dgs.data(), F, n, E, F, tg->grad.data(), nullptr);
      if (tu) linear_backward_weight(xs.data(), E, dus.data(), F, n, E, F, tu->grad.data(), nullptr);
    }
    if (g.df_out) {
      float* dr = drow.v.data() + r0 * E;
      std::fill(dr, dr + n * E, 0.0f);
      linear_backward_input(expert_matrix(il, e, TrainedParams::Gate), dgs.data(), F, n, dr, E, nullptr);
      linear_backward_input(expert_matrix(il, e, TrainedParams::Up), dus.data(), F, n, dr, E, nullptr);
    }
  }

  // Router: weights -> probabilities -> logits, plus the balance loss at trained routers.
  void moe_router_backward(int il, const MoeGrad& g) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const int64_t E = hp.n_embd, X = hp.n_expert, K = L.n_expert_used;
    const bool router_trained = g.grads && g.grads->router(il);
    const RouterConfig rc = router_config(L);
    float* pdz = dz.zero(T * X);
    const float* pp = p.v.data();
    const float* pdw = dw.v.data();
    for_rows(T, pool, double(X) * 4, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) router_backward(rc, pp + t * X, ids.data() + t * K, pdw + t * K, pdz + t * X);
    });
    if (router_trained && opts.balance_weight > 0)
      balance_loss(rc, balance_groups(), pp, ids.data(), T, opts.balance_weight, pdz);
    if (router_trained) linear_backward_weight(f.v.data(), E, pdz, X, T, E, X, g.grads->router(il)->grad.data(), &pool);
    if (g.df_out) linear_backward_input(router_matrix(il), pdz, X, T, g.df_out, E, &pool);
  }

  // dh1 -> gradient of the layer input x (the residual path plus the attention branch).
  void attention_backward_layer(int il, const float* x_in, const float* pdh1, float* dx_in) {
    const LayerHParams& L = hp.layers[size_t(il)];
    const LayerWeights& W = m.layer(il);
    const int64_t E = hp.n_embd, H = L.n_head, G = L.n_head_kv, D = hp.head_dim_k, Dv = hp.head_dim_v;
    float* pdog = dog.zero(T * H * Dv);
    linear_backward_input(W.attn_output, pdh1, E, T, pdog, H * Dv, &pool);
    float* pdo = pdog;
    float* pdg = nullptr;
    if (W.attn_gate.present()) {
      pdo = d_o.get(T * H * Dv);
      pdg = dgraw.get(T * H);
      head_gate_backward(graw.v.data(), o.v.data(), pdog, pdg, pdo, T, H, Dv);
    }
    float* pdqr = dqr.get(T * H * D);
    float* pdkr = dkr.get(T * G * D);
    float* pdv = dv.get(T * G * Dv);
    AttentionShape s{C, H, G, D, Dv, L.is_swa ? hp.swa_window : 0};
    // Query blocks (dq) and key blocks (dk, dv) write disjoint rows: one pool section.
    const int64_t nb = (C + kAttnRows - 1) / kAttnRows;
    for_each(2 * int64_t(B) * G * nb, pool, 3 * attention_work(s, B), [&](int64_t job) {
      const bool keys = job % 2 == 1;
      job /= 2;
      const int64_t b = job / (G * nb), g = job / nb % G, r0 = job % nb * kAttnRows, t0 = b * C;
      const int64_t r1 = std::min<int64_t>(C, r0 + kAttnRows);
      const float *pq = qr.v.data() + t0 * H * D, *pk = kr.v.data() + t0 * G * D, *pv = v.v.data() + t0 * G * Dv;
      const float *po = o.v.data() + t0 * H * Dv, *pl = lse.v.data() + t0 * H;
      if (keys)
        attention_backward_keys(s, pq, pk, pv, po, pl, pdo + t0 * H * Dv, pdkr + t0 * G * D, pdv + t0 * G * Dv, g, r0,
                                r1);
      else
        attention_backward_queries(s, pq, pk, pv, po, pl, pdo + t0 * H * Dv, pdqr + t0 * H * D, g, r0, r1);
    });
    const float* tab = rope(L);
    for (int32_t b = 0; b < B; ++b) {
      rope_backward(pdqr + int64_t(b) * C * H * D, C, H, D, L.n_rot / 2, tab);
      rope_backward(pdkr + int64_t(b) * C * G * D, C, G, D, L.n_rot / 2, tab);
    }
    float* pdq = pdqr;
    float* pdk = pdkr;
    if (!W.attn_q_norm.empty()) {
      pdq = dq.get(T * H * D);
      for_rows(T * H, pool, double(D) * 6, [&](int64_t b, int64_t e) {
        rms_norm_backward(q.v.data() + b * D, W.attn_q_norm.data(), inv_q.v.data() + b, pdqr + b * D, pdq + b * D,
                          e - b, D, false);
      });
    }
    if (!W.attn_k_norm.empty()) {
      pdk = dk.get(T * G * D);
      for_rows(T * G, pool, double(D) * 6, [&](int64_t b, int64_t e) {
        rms_norm_backward(k.v.data() + b * D, W.attn_k_norm.data(), inv_k.v.data() + b, pdkr + b * D, pdk + b * D,
                          e - b, D, false);
      });
    }
    float* pda = da.zero(T * E);
    linear_backward_input(W.attn_q, pdq, H * D, T, pda, E, &pool);
    linear_backward_input(W.attn_k, pdk, G * D, T, pda, E, &pool);
    linear_backward_input(W.attn_v, pdv, G * Dv, T, pda, E, &pool);
    if (pdg) linear_backward_input(W.attn_gate, pdg, H, T, pda, E, &pool);
    std::memcpy(dx_in, pdh1, size_t(T * E) * sizeof(float));
    for_rows(T, pool, double(E) * 6, [&](int64_t b, int64_t e) {
      rms_norm_backward(x_in + b * E, W.attn_norm.data(), inv_a.v.data() + b, pda + b * E, dx_in + b * E, e - b, E,
                        true);
    });
  }

  // ---------------------------------------------------------------------------------
  // Head: logits in chunks of rows, cross-entropy, and the gradient of the final hidden.

  void head(const float* xf, const int32_t* targets, int64_t n_targets, double* losses, float* dxf,
            std::vector<float>* all_logits) {
    const int64_t E = hp.n_embd, V = hp.n_vocab;
    float* pn = normed.get(T * E);
    float* pinv = inv_out.get(T);
    rms_rows(xf, m.output_norm(), pn, pinv, T, E);
    if (all_logits) {
      all_logits->resize(size_t(T * V));
      linear_forward(m.output(), pn, E, T, all_logits->data(), V, &pool, opts.precision);
      return;
    }
    const int64_t chunk = opts.logits_chunk > 0 ? opts.logits_chunk : std::max<int64_t>(16, (int64_t(1) << 24) / V);
    float* pl = logits.get(std::min(T, chunk) * V);
    float* pdl = dxf ? dlogits.get(std::min(T, chunk) * V) : nullptr;
    float* pdn = dxf ? dnormed.zero(T * E) : nullptr;
    const float scale = n_targets > 0 ? 1.0f / float(n_targets) : 0.0f;
    for (int64_t r0 = 0; r0 < T; r0 += chunk) {
      const int64_t n = std::min(chunk, T - r0);
      linear_forward(m.output(), pn + r0 * E, E, n, pl, V, &pool, opts.precision);
      for_rows(n, pool, double(V) * 8, [&](int64_t b, int64_t e) {
        cross_entropy(pl + b * V, targets + r0 + b, e - b, V, losses + r0 + b, pdl ? pdl + b * V : nullptr, scale);
      });
      if (pdl) linear_backward_input(m.output(), pdl, V, n, pdn + r0 * E, E, &pool);
    }
    if (dxf)
      for_rows(T, pool, double(E) * 6, [&](int64_t b, int64_t e) {
        rms_norm_backward(xf + b * E, m.output_norm().data(), pinv + b, pdn + b * E, dxf + b * E, e - b, E, false);
      });
  }
};

TrainingModel::TrainingModel(const Model& m, const TrainedParams* params, ThreadPool& pool, TrainingOptions opts)
    : s_(std::make_unique<State>(m, params, pool, opts)) {}

TrainingModel::~TrainingModel() = default;

uint64_t TrainingModel::activation_bytes() const { return s_->bytes(); }

LossStats TrainingModel::run(const TrainBatch& batch, TrainedParams* grads) {
  State& S = *s_;
  if (grads && grads != S.params) throw std::invalid_argument("TrainingModel::run: gradients of other parameters");
  if (batch.n_seq <= 0 || batch.n_ctx <= 0 || int64_t(batch.tokens.size()) != int64_t(batch.n_seq) * batch.n_ctx ||
      batch.targets.size() != batch.tokens.size())
    throw std::invalid_argument("TrainingModel::run: malformed batch");
  S.set_geometry(batch.n_seq, batch.n_ctx);
  S.layer_in_buffers = -1;
  const HParams& hp = S.hp;
  const int64_t T = S.T, E = hp.n_embd;
  const int n_layer = hp.n_layer;
  const int lowest = grads ? S.params->lowest_layer() : -1;
  const bool backward = grads && lowest >= 0;

  LossStats stats;
  stats.expert_counts.resize(size_t(n_layer));
  if (S.opts.record_topk) stats.topk.resize(size_t(n_layer));
  S.routed.assign(size_t(T), 0);

  float* x = S.x.get(T * E);
  float* xn = S.x_next.get(T * E);
  S.embed(batch.tokens, x);
  if (backward) S.ckpt.resize(size_t(n_layer));
  for (int il = 0; il < n_layer; ++il) {
    if (backward && il >= lowest) {
      float* c = S.ckpt[size_t(il)].get(T * E);
      std::memcpy(c, x, size_t(T * E) * sizeof(float));
    }
    S.forward_layer(il, x, xn, &stats);
    std::swap(x, xn);
  }

  int64_t n_targets = 0;
  for (int32_t y : batch.targets) n_targets += y >= 0;
  S.row_loss.assign(size_t(T), 0.0);
  float* dx = backward ? S.dx.get(T * E) : nullptr;
  S.head(x, batch.targets.data(), n_targets, S.row_loss.data(), dx, nullptr);
  for (int64_t t = 0; t < T; ++t) {
    if (batch.targets[size_t(t)] < 0) continue;
    stats.loss_sum += S.row_loss[size_t(t)];
    ++stats.n_targets;
    if (S.routed[size_t(t)]) {
      stats.routed_loss_sum += S.row_loss[size_t(t)];
      ++stats.n_routed;
    }
  }
  if (!backward) return stats;

  // Backward, one layer at a time from the top: recompute the layer from its checkpoint,
  // then take its gradient.
  float* dxn = S.dx_next.get(T * E);
  float* scratch = S.x_next.get(T * E);
  for (int il = n_layer - 1; il >= lowest; --il) {
    const float* xin = S.ckpt[size_t(il)].v.data();
    // The last layer's intermediates are still there from the forward pass.
    if (S.layer_in_buffers != il) S.forward_layer(il, xin, scratch, nullptr);
    const bool need_dx = il > lowest;
    S.backward_layer(il, xin, dx, need_dx ? dxn : nullptr, need_dx, grads);
    if (need_dx) std::swap(dx, dxn);
  }
  return stats;
}

std::vector<float> TrainingModel::logits(const std::vector<int32_t>& tokens) {
  State& S = *s_;
  if (tokens.empty()) throw std::invalid_argument("TrainingModel::logits: no tokens");
  S.set_geometry(1, int32_t(tokens.size()));
  const int64_t T = S.T, E = S.hp.n_embd;
  float* x = S.x.get(T * E);
  float* xn = S.x_next.get(T * E);
  S.embed(tokens, x);
  for (int il = 0; il < S.hp.n_layer; ++il) {
    S.forward_layer(il, x, xn, nullptr);
    std::swap(x, xn);
  }
  std::vector<float> out;
  S.head(x, nullptr, 0, nullptr, nullptr, &out);
  return out;
}

}  // namespace step35::train
