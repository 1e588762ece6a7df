// Forward and backward of each step35 operation (docs/architecture.md, "The model") in
// F32, one function pair per op. A backward takes what its forward saved and the
// gradient of the op's output, and produces (or adds to) the gradient of its inputs.
// docs/finetune.md derives each formula; tests/test_train_ops.cpp checks every one
// against central finite differences.
//
// Activations are row-major, one row per token. "accumulate" arguments say whether a
// backward adds to the gradient buffer (true) or overwrites it.
#pragma once

#include <cstdint>
#include <vector>

namespace step35::train {

// ---------------------------------------------------------------------------------------
// RMSNorm (architecture.md "Conventions"): y = x · r · w, r = 1 / sqrt(mean(x²) + eps),
// per row of n.

// Saves r per row in inv_rms[rows]. The same float operations as the forward pass, so
// y is bitwise the engine's.
void rms_norm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t rows, int64_t n, float eps);
// dx = r·w⊙dy − x · r³/n · Σ_i dy_i w_i x_i (norm weights are frozen: no gradient).
void rms_norm_backward(const float* x, const float* w, const float* inv_rms, const float* dy, float* dx, int64_t rows,
                       int64_t n, bool accumulate);

// ---------------------------------------------------------------------------------------
// RoPE, NeoX layout (architecture.md "Attention", step 3), in place on the first 2·half dims of
// each head.

// cos/sin of every position's angles: table[p][0..half) = cos θ_j, [half..2half) = sin θ_j
// with θ_j = pos · base^(−2j/n_rot) / freq_factors[j] (factors may be null), as the
// forward pass tabulates them.
std::vector<float> rope_table(const int32_t* pos, int64_t n_pos, int32_t n_rot, float base,
                              const float* freq_factors);
// x: rows of n_heads heads of head_dim; row t uses table row t.
void rope_forward(float* x, int64_t rows, int64_t n_heads, int64_t head_dim, int32_t half, const float* table);
// The rotation's transpose (rotation by −θ) applied to the gradient, in place.
void rope_backward(float* dx, int64_t rows, int64_t n_heads, int64_t head_dim, int32_t half, const float* table);

// ---------------------------------------------------------------------------------------
// Causal attention with GQA and an optional sliding window (architecture.md "Attention",
// steps 4-6) over one sequence of n tokens (positions 0..n-1): q [n][H][D], k [n][G][D],
// v [n][G][Dv], out [n][H][Dv]. Query head h reads KV head h / (H/G). window > 0: a query at
// t sees keys u with t − u < window.

struct AttentionShape {
  int64_t n = 0, H = 0, G = 0, D = 0, Dv = 0;
  int32_t window = 0;  // 0: full causal
};

// Saves the log-sum-exp of each (token, head) score row in lse [n][H]; with out null, only
// that (the training forward takes its output from the engine's attention). kv_head and
// [t0, t1) restrict the work to one KV head with its query heads (-1: all) and to a range
// of queries, so callers can split it between threads; -1 for t1 means n.
void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v, float* out,
                       float* lse, int64_t kv_head = -1, int64_t t0 = 0, int64_t t1 = -1);
// The backward in two passes that write disjoint rows, so both split between threads:
// the query side writes dq for queries [t0, t1), the key side dk and dv for keys
// [u0, u1). Each recomputes the scores it needs from q, k and lse. Rows outside the
// ranges (and heads outside kv_head) are left alone.
void attention_backward_queries(const AttentionShape& s, const float* q, const float* k, const float* v,
                                const float* out, const float* lse, const float* dout, float* dq, int64_t kv_head,
                                int64_t t0, int64_t t1);
void attention_backward_keys(const AttentionShape& s, const float* q, const float* k, const float* v, const float* out,
                             const float* lse, const float* dout, float* dk, float* dv, int64_t kv_head, int64_t u0,
                             int64_t u1);
// Both passes over everything: overwrites dq, dk, dv.
void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const float* dout, float* dq, float* dk, float* dv);

// ---------------------------------------------------------------------------------------
// SwiGLU with the step35 clamp (architecture.md "Dense MLP and the SwiGLU clamp"):
// limit <= 1e-6 means none, else act = min(silu(g), L) · clamp(u, −L, L). rows x n values,
// row stride ld for g and u.

void swiglu_forward(const float* g, const float* u, int64_t ld, float limit, int64_t rows, int64_t n, float* act);
// Overwrites dg and du (stride ld). Where a clamp is active the clamped input gets no
// gradient.
void swiglu_backward(const float* g, const float* u, int64_t ld, float limit, int64_t rows, int64_t n,
                     const float* dact, float* dg, float* du);

// ---------------------------------------------------------------------------------------
// Head-wise gate (architecture.md "Attention", step 7): o_h ← σ(graw_h) · o_h for each of H heads
// of Dv values.

void head_gate_forward(const float* graw, const float* o, float* out, int64_t rows, int64_t H, int64_t Dv);
// dgraw = σ'(graw) · Σ dout_h ⊙ o_h; do = σ(graw) · dout (both overwritten).
void head_gate_backward(const float* graw, const float* o, const float* dout, float* dgraw, float* d_o, int64_t rows,
                        int64_t H, int64_t Dv);

// ---------------------------------------------------------------------------------------
// MoE router (architecture.md "MoE routing and the shared expert", steps 2-4) for one token: X
// expert logits z, selection bias b (may be null), top-k by p + b, weights p[chosen] (normalised if
// `normalize`, × scale). p = σ(z) (sigmoid gating) or softmax(z).

struct RouterConfig {
  int64_t n_expert = 0, k = 0;
  bool sigmoid = true;
  bool normalize = true;
  float scale = 1.0f;
};

// p[X] (probabilities), ids[k] (selection order: descending p + b, ties to the lower id),
// w[k] (final weights). Returns the sum of the chosen p that the weights were divided by
// (before the clamp the forward pass applies), or 0 without normalisation.
float router_forward(const RouterConfig& c, const float* z, const float* bias, float* p, int32_t* ids, float* w);
// Given dw[k], adds the gradient of the logits to dz[X] (the selection itself is not
// differentiable: ids stay fixed).
void router_backward(const RouterConfig& c, const float* p, const int32_t* ids, const float* dw, float* dz);

// ---------------------------------------------------------------------------------------
// Expert-group balance loss over the T tokens of one MoE layer: L = G · Σ_g f_g · P_g,
// f_g = share of the T·k selections that went to experts of group g (constant), P_g =
// mean over tokens of Σ_{e∈g} q_e, q = the router probabilities normalised over all
// experts (p / Σp for sigmoid gating; p itself for softmax). Groups are G equal ranges
// of expert ids (G divides X). Returns L; with dz non-null adds weight · dL/dz.

double balance_loss(const RouterConfig& c, int64_t n_groups, const float* p, const int32_t* ids, int64_t T,
                    float weight, float* dz);

// ---------------------------------------------------------------------------------------
// Cross-entropy of rows of V logits against target ids (< 0: ignored). Writes each row's
// loss (log-sum-exp − logit[target], 0 without a target) to row_loss[t] and, with
// dlogits non-null, scale · (softmax − onehot) there (zeros for rows without a target).

void cross_entropy(const float* logits, const int32_t* targets, int64_t rows, int64_t V, double* row_loss,
                   float* dlogits, float scale);

}  // namespace step35::train
