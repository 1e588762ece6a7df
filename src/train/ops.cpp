#include "train/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/layer_math.h"
#include "tensor/kernels.h"

namespace step35::train {

// The forward arithmetic (RMS norm, RoPE, the router) is the inference forward's own,
// model/layer_math.h; the backward steps beside it are this file's.

// ---------------------------------------------------------------------------------------
// RMSNorm

void rms_norm_forward(const float* x, const float* w, float* y, float* inv_rms, int64_t rows, int64_t n, float eps) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* xt = x + t * n;
    const float r = rms_norm_row(xt, w, y + t * n, n, eps);
    if (inv_rms) inv_rms[t] = r;
  }
}

void rms_norm_backward(const float* x, const float* w, const float* inv_rms, const float* dy, float* dx, int64_t rows,
                       int64_t n, bool accumulate) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* xt = x + t * n;
    const float* dyt = dy + t * n;
    float* dxt = dx + t * n;
    const double r = inv_rms[t];
    double dot = 0;  // Σ dy_i w_i x_i
    for (int64_t i = 0; i < n; ++i) dot += double(dyt[i]) * w[i] * xt[i];
    const double c = r * r * r * dot / double(n);
    for (int64_t i = 0; i < n; ++i) {
      const float g = float(r * w[i] * dyt[i] - c * xt[i]);
      dxt[i] = accumulate ? dxt[i] + g : g;
    }
  }
}

// ---------------------------------------------------------------------------------------
// RoPE

std::vector<float> rope_table(const int32_t* pos, int64_t n_pos, int32_t n_rot, float base,
                              const float* freq_factors) {
  const int32_t half = n_rot / 2;
  std::vector<float> tab(size_t(n_pos) * size_t(2 * half));
  for (int64_t t = 0; t < n_pos; ++t) rope_angles(pos[t], n_rot, base, freq_factors, tab.data() + t * 2 * half);
  return tab;
}

void rope_forward(float* x, int64_t rows, int64_t n_heads, int64_t head_dim, int32_t half, const float* table) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* cs = table + t * 2 * half;
    const float* sn = cs + half;
    for (int64_t h = 0; h < n_heads; ++h) rope_apply(x + (t * n_heads + h) * head_dim, half, cs, sn);
  }
}

void rope_backward(float* dx, int64_t rows, int64_t n_heads, int64_t head_dim, int32_t half, const float* table) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* cs = table + t * 2 * half;
    const float* sn = cs + half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* dh = dx + (t * n_heads + h) * head_dim;
      for (int32_t i = 0; i < half; ++i) {
        const float d0 = dh[i], d1 = dh[i + half];
        dh[i] = d0 * cs[i] + d1 * sn[i];
        dh[i + half] = -d0 * sn[i] + d1 * cs[i];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Attention

namespace {

int64_t first_key(const AttentionShape& s, int64_t t) {
  return s.window > 0 ? std::max<int64_t>(0, t - s.window + 1) : 0;
}

}  // namespace

void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v, float* out,
                       float* lse, int64_t kv_head, int64_t t0, int64_t t1) {
  const int64_t R = s.H / s.G;
  const float scale = 1.0f / std::sqrt(float(s.D));
  const int64_t g0 = kv_head < 0 ? 0 : kv_head, g1 = kv_head < 0 ? s.G : kv_head + 1;
  if (t1 < 0) t1 = s.n;
  thread_local std::vector<float> sc, zs;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t lo = first_key(s, t), nk = t - lo + 1;
    sc.resize(size_t(R * nk));
    for (int64_t g = g0; g < g1; ++g) {
      // Scores of the group's R query heads against the visible keys, then per head a
      // softmax and the weighted sum of the value rows (the forward pass's kernels).
      kernels::attn_scores(q + (t * s.H + g * R) * s.D, s.D, R, k + (lo * s.G + g) * s.D, s.G * s.D, nk, s.D, scale,
                           sc.data(), nk);
      zs.resize(size_t(R));
      for (int64_t r = 0; r < R; ++r) {
        float* p = sc.data() + r * nk;
        float mx = -INFINITY;
        for (int64_t j = 0; j < nk; ++j) mx = std::max(mx, p[j]);
        zs[size_t(r)] = kernels::exp_shift_sum(p, nk, mx);
        lse[t * s.H + g * R + r] = mx + std::log(zs[size_t(r)]);
      }
      if (out == nullptr) continue;
      // The group's R heads read the same value rows: one product for all of them.
      float* og = out + (t * s.H + g * R) * s.Dv;
      std::fill(og, og + R * s.Dv, 0.0f);
      kernels::gemm_acc_f32(R, s.Dv, nk, sc.data(), nk, 1, v + (lo * s.G + g) * s.Dv, s.G * s.Dv, og, s.Dv);
      for (int64_t r = 0; r < R; ++r) kernels::scale_f32(1.0f / zs[size_t(r)], og + r * s.Dv, s.Dv);
    }
  }
}

// dL/ds = p ⊙ (dp − δ) with dp_j = dO · v_j and δ = dO · O (= Σ_j p_j dp_j): the softmax's
// backward; the scale of the scores is folded in.
void attention_backward_queries(const AttentionShape& s, const float* q, const float* k, const float* v,
                                const float* out, const float* lse, const float* dout, float* dq, int64_t kv_head,
                                int64_t t0, int64_t t1) {
  const int64_t R = s.H / s.G;
  const float scale = 1.0f / std::sqrt(float(s.D));
  const int64_t g0 = kv_head < 0 ? 0 : kv_head, g1 = kv_head < 0 ? s.G : kv_head + 1;
  thread_local std::vector<float> sc, dp;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t lo = first_key(s, t), nk = t - lo + 1;
    sc.resize(size_t(R * nk));
    dp.resize(size_t(R * nk));
    for (int64_t g = g0; g < g1; ++g) {
      kernels::attn_scores(q + (t * s.H + g * R) * s.D, s.D, R, k + (lo * s.G + g) * s.D, s.G * s.D, nk, s.D, scale,
                           sc.data(), nk);
      kernels::attn_scores(dout + (t * s.H + g * R) * s.Dv, s.Dv, R, v + (lo * s.G + g) * s.Dv, s.G * s.Dv, nk, s.Dv,
                           1.0f, dp.data(), nk);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t h = g * R + r;
        const float delta = kernels::dot_f32(dout + (t * s.H + h) * s.Dv, out + (t * s.H + h) * s.Dv, s.Dv);
        const float l = lse[t * s.H + h];
        float* ds = sc.data() + r * nk;
        const float* dpr = dp.data() + r * nk;
        for (int64_t j = 0; j < nk; ++j) ds[j] = std::exp(ds[j] - l) * (dpr[j] - delta) * scale;
      }
      // The group's R heads read the same key rows: one product for all of them.
      float* dqg = dq + (t * s.H + g * R) * s.D;
      std::fill(dqg, dqg + R * s.D, 0.0f);
      kernels::gemm_acc_f32(R, s.D, nk, sc.data(), nk, 1, k + (lo * s.G + g) * s.D, s.G * s.D, dqg, s.D);
    }
  }
}

namespace {

// attention_backward_keys for keys [u0, u1) (a block of at most kKeyBlock).
void backward_key_block(const AttentionShape& s, const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const float* dout, float* dk, float* dv, int64_t g0, int64_t g1, int64_t u0,
                        int64_t u1) {
  const int64_t R = s.H / s.G;
  const float scale = 1.0f / std::sqrt(float(s.D));
  thread_local std::vector<float> p, dp, delta;
  // δ = dO · O of every query these keys' gradients need (queries u0 .. t_last).
  const int64_t t_last = s.window > 0 ? std::min(s.n - 1, u1 - 1 + s.window - 1) : s.n - 1;
  delta.resize(size_t((t_last - u0 + 1) * s.H));
  for (int64_t t = u0; t <= t_last; ++t)
    for (int64_t h = g0 * R; h < g1 * R; ++h)
      delta[size_t((t - u0) * s.H + h)] = kernels::dot_f32(dout + (t * s.H + h) * s.Dv, out + (t * s.H + h) * s.Dv, s.Dv);
  // The whole block of keys at once, per head: P[u][t] (zero where query t does not see
  // key u) against the queries u0..t_last, so dv and dk are products of the block's rows
  // with the query side's rows (gemm_acc_f32) rather than one row per key.
  const int64_t nu = u1 - u0, nq = t_last - u0 + 1;
  p.resize(size_t(nu * nq));
  dp.resize(size_t(nu * nq));
  for (int64_t g = g0; g < g1; ++g) {
    float* dkg = dk + (u0 * s.G + g) * s.D;
    float* dvg = dv + (u0 * s.G + g) * s.Dv;
    for (int64_t u = 0; u < nu; ++u) {
      std::fill(dkg + u * s.G * s.D, dkg + u * s.G * s.D + s.D, 0.0f);
      std::fill(dvg + u * s.G * s.Dv, dvg + u * s.G * s.Dv + s.Dv, 0.0f);
    }
    for (int64_t h = g * R; h < (g + 1) * R; ++h) {
      const float* qh = q + (u0 * s.H + h) * s.D;  // query rows t = u0.. of head h
      const float* doh = dout + (u0 * s.H + h) * s.Dv;
      kernels::attn_scores(k + (u0 * s.G + g) * s.D, s.G * s.D, nu, qh, s.H * s.D, nq, s.D, scale, p.data(), nq);
      kernels::attn_scores(v + (u0 * s.G + g) * s.Dv, s.G * s.Dv, nu, doh, s.H * s.Dv, nq, s.Dv, 1.0f, dp.data(), nq);
      for (int64_t u = 0; u < nu; ++u) {
        float* pu = p.data() + u * nq;
        float* dpu = dp.data() + u * nq;
        // Query t = u0 + j sees key u0 + u when u <= j (and j - u < window).
        const int64_t j_end = s.window > 0 ? std::min(nq, u + s.window) : nq;
        for (int64_t j = 0; j < nq; ++j) {
          if (j < u || j >= j_end) {
            pu[j] = 0.0f;
            dpu[j] = 0.0f;
            continue;
          }
          const int64_t t = u0 + j;
          pu[j] = std::exp(pu[j] - lse[t * s.H + h]);
          dpu[j] = pu[j] * (dpu[j] - delta[size_t(j * s.H + h)]) * scale;
        }
      }
      kernels::gemm_acc_f32(nu, s.Dv, nq, p.data(), nq, 1, doh, s.H * s.Dv, dvg, s.G * s.Dv);
      kernels::gemm_acc_f32(nu, s.D, nq, dp.data(), nq, 1, qh, s.H * s.D, dkg, s.G * s.D);
    }
  }
}

// Keys per block: the block's score rows (kKeyBlock x the queries that see it) stay small.
constexpr int64_t kKeyBlock = 32;

}  // namespace

void attention_backward_keys(const AttentionShape& s, const float* q, const float* k, const float* v, const float* out,
                             const float* lse, const float* dout, float* dk, float* dv, int64_t kv_head, int64_t u0,
                             int64_t u1) {
  const int64_t g0 = kv_head < 0 ? 0 : kv_head, g1 = kv_head < 0 ? s.G : kv_head + 1;
  for (int64_t b = u0; b < u1; b += kKeyBlock)
    backward_key_block(s, q, k, v, out, lse, dout, dk, dv, g0, g1, b, std::min(u1, b + kKeyBlock));
}

void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  attention_backward_queries(s, q, k, v, out, lse, dout, dq, -1, 0, s.n);
  attention_backward_keys(s, q, k, v, out, lse, dout, dk, dv, -1, 0, s.n);
}

// ---------------------------------------------------------------------------------------
// SwiGLU

void swiglu_forward(const float* g, const float* u, int64_t ld, float limit, int64_t rows, int64_t n, float* act) {
  // The kernels' F32 "conversion" is the forward pass's own SwiGLU, so the values match.
  // It pads each row to 64 bytes: one row at a time through a buffer of that size.
  thread_local std::vector<uint8_t> row;
  row.resize(kernels::act_row_bytes(kernels::ActType::F32, n));
  for (int64_t r = 0; r < rows; ++r) {
    kernels::swiglu_convert(kernels::ActType::F32, g + r * ld, u + r * ld, ld, limit, 1, n, row.data());
    std::memcpy(act + r * n, row.data(), size_t(n) * sizeof(float));
  }
}

void swiglu_backward(const float* g, const float* u, int64_t ld, float limit, int64_t rows, int64_t n,
                     const float* dact, float* dg, float* du) {
  const bool clamp = limit > 1e-6f;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = r * ld + i;
      const float x = g[j], y = u[j], d = dact[r * n + i];
      const float sg = sigmoid(x);
      const float silu = x * sg;
      const float dsilu = sg * (1.0f + x * (1.0f - sg));
      if (!clamp) {
        dg[j] = d * y * dsilu;
        du[j] = d * silu;
        continue;
      }
      const float yc = std::fmin(std::fmax(y, -limit), limit);
      dg[j] = silu < limit ? d * yc * dsilu : 0.0f;
      du[j] = (y > -limit && y < limit) ? d * std::fmin(silu, limit) : 0.0f;
    }
}

// ---------------------------------------------------------------------------------------
// Head-wise gate

void head_gate_forward(const float* graw, const float* o, float* out, int64_t rows, int64_t H, int64_t Dv) {
  for (int64_t th = 0; th < rows * H; ++th) {
    const float gam = sigmoid(graw[th]);
    for (int64_t i = 0; i < Dv; ++i) out[th * Dv + i] = o[th * Dv + i] * gam;
  }
}

void head_gate_backward(const float* graw, const float* o, const float* dout, float* dgraw, float* d_o, int64_t rows,
                        int64_t H, int64_t Dv) {
  for (int64_t th = 0; th < rows * H; ++th) {
    const float gam = sigmoid(graw[th]);
    const float* ot = o + th * Dv;
    const float* dt = dout + th * Dv;
    dgraw[th] = kernels::dot_f32(dt, ot, Dv) * gam * (1.0f - gam);
    for (int64_t i = 0; i < Dv; ++i) d_o[th * Dv + i] = dt[i] * gam;
  }
}

// ---------------------------------------------------------------------------------------
// Router

float router_forward(const RouterConfig& c, const float* z, const float* bias, float* p, int32_t* ids, float* w) {
  const int64_t X = c.n_expert, K = c.k;
  std::copy(z, z + X, p);
  router_probabilities(c.sigmoid, p, X);
  std::vector<float> sel(static_cast<size_t>(K));
  router_top_k(p, bias, X, K, ids, sel.data());
  float sum = 0;
  for (int64_t k = 0; k < K; ++k) sum += (w[k] = p[ids[k]]);
  const float norm = expert_weight_norm(c.normalize, sum);
  for (int64_t k = 0; k < K; ++k) w[k] = w[k] * norm * c.scale;
  return c.normalize ? sum : 0.0f;
}

void router_backward(const RouterConfig& c, const float* p, const int32_t* ids, const float* dw, float* dz) {
  const int64_t X = c.n_expert, K = c.k;
  // Gradient of the chosen probabilities: w_k = scale · p_k / S (S = Σ_chosen p, when
  // normalising and not clamped), so ∂L/∂p_j = scale · (dw_j / S − Σ_k dw_k p_k / S²).
  std::vector<float> dp(static_cast<size_t>(K));
  double S = 0, A = 0;
  for (int64_t k = 0; k < K; ++k) {
    S += p[ids[k]];
    A += double(dw[k]) * p[ids[k]];
  }
  for (int64_t k = 0; k < K; ++k) {
    if (!c.normalize)
      dp[size_t(k)] = c.scale * dw[k];
    else if (float(S) >= kMinExpertWeightSum)
      dp[size_t(k)] = float(c.scale * (dw[k] / S - A / (S * S)));
    else
      dp[size_t(k)] = c.scale * dw[k] / kMinExpertWeightSum;
  }
  if (c.sigmoid) {
    for (int64_t k = 0; k < K; ++k) {
      const float pk = p[ids[k]];
      dz[ids[k]] += dp[size_t(k)] * pk * (1.0f - pk);
    }
  } else {
    double dot = 0;  // Σ_j dp_j p_j over the chosen experts (dp is 0 elsewhere)
    for (int64_t k = 0; k < K; ++k) dot += double(dp[size_t(k)]) * p[ids[k]];
    for (int64_t e = 0; e < X; ++e) dz[e] -= float(p[e] * dot);
    for (int64_t k = 0; k < K; ++k) dz[ids[k]] += p[ids[k]] * dp[size_t(k)];
  }
}

double balance_loss(const RouterConfig& c, int64_t n_groups, const float* p, const int32_t* ids, int64_t T,
                    float weight, float* dz) {
  const int64_t X = c.n_expert, K = c.k, per = X / n_groups;
  std::vector<double> f(size_t(n_groups), 0.0), P(size_t(n_groups), 0.0);
  for (int64_t i = 0; i < T * K; ++i) f[size_t(ids[i] / per)] += 1.0;
  for (double& x : f) x /= double(T * K);
  std::vector<double> q(static_cast<size_t>(X));
  for (int64_t t = 0; t < T; ++t) {
    const float* pt = p + t * X;
    double Q = 1.0;
    if (c.sigmoid) {
      Q = 0;
      for (int64_t e = 0; e < X; ++e) Q += pt[e];
    }
    for (int64_t e = 0; e < X; ++e) P[size_t(e / per)] += pt[e] / Q;
    if (!dz) continue;
    // ∂L/∂q_e = weight · G · f_g(e) / T, then through q = p / Σp (sigmoid) or the softmax.
    double cq = 0;
    for (int64_t e = 0; e < X; ++e) {
      q[size_t(e)] = weight * double(n_groups) * f[size_t(e / per)] / double(T);
      cq += q[size_t(e)] * pt[e] / Q;
    }
    float* dzt = dz + t * X;
    for (int64_t e = 0; e < X; ++e) {
      if (c.sigmoid) {
        const double dp = (q[size_t(e)] - cq) / Q;
        dzt[e] += float(dp * pt[e] * (1.0 - pt[e]));
      } else {
        dzt[e] += float(pt[e] * (q[size_t(e)] - cq));
      }
    }
  }
  double L = 0;
  for (int64_t g = 0; g < n_groups; ++g) L += f[size_t(g)] * P[size_t(g)] / double(T);
  return double(n_groups) * L;
}

// ---------------------------------------------------------------------------------------
// Cross-entropy

void cross_entropy(const float* logits, const int32_t* targets, int64_t rows, int64_t V, double* row_loss,
                   float* dlogits, float scale) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* l = logits + t * V;
    float* d = dlogits ? dlogits + t * V : nullptr;
    const int32_t y = targets[t];
    if (y < 0) {
      row_loss[t] = 0;
      if (d) std::fill(d, d + V, 0.0f);
      continue;
    }
    const float mx = *std::max_element(l, l + V);
    double z = 0;
    for (int64_t i = 0; i < V; ++i) z += std::exp(double(l[i] - mx));
    const double lse = double(mx) + std::log(z);
    row_loss[t] = lse - double(l[y]);
    if (d) {
      for (int64_t i = 0; i < V; ++i) d[i] = float(scale * std::exp(double(l[i]) - lse));
      d[y] -= scale;
    }
  }
}

}  // namespace step35::train
