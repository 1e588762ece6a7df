// Gradient checks of every training op (src/train/ops.h, src/train/linear.h): the
// analytic backward against central finite differences of the forward, in F32 with a
// sweep of step sizes (the best step must agree within 1e-3 relative error).
//
// Each check reduces the op's output to a scalar with a fixed random projection
// c (L = Σ c_i out_i, summed in double), so the backward's input is c; it then compares
// directional derivatives along random directions and single coordinates.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "exec/thread_pool.h"
#include "tensor/quants.h"
#include "train/linear.h"
#include "train/ops.h"

using namespace step35;
using namespace step35::train;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double project(const std::vector<float>& out, const std::vector<float>& c) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += double(out[i]) * c[i];
  return s;
}

// The smallest relative error between the analytic directional derivative `analytic` and
// central differences (L(x + h d) − L(x − h d)) / 2h over the step sweep, each step also
// with h/2 and their Richardson extrapolation (4·D(h/2) − D(h)) / 3, which cancels the h²
// term: large steps, where the F32 rounding of the loss matters least, then stay accurate
// for directions whose derivative is small next to the loss.
double best_relative_error(const std::function<double()>& loss, std::vector<float>& x, const std::vector<float>& dir,
                           double analytic) {
  double best = INFINITY;
  const std::vector<float> x0 = x;
  auto central = [&](double h) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(x0[i] + h * dir[i]);
    const double lp = loss();
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(x0[i] - h * dir[i]);
    const double lm = loss();
    x = x0;
    return (lp - lm) / (2 * h);
  };
  for (double h : {1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4}) {
    const double fd = central(h), fd_half = central(h / 2);
    for (double est : {fd, fd_half, (4 * fd_half - fd) / 3}) {
      const double err = std::fabs(est - analytic) / std::max({std::fabs(analytic), std::fabs(est), 1e-6});
      best = std::min(best, err);
    }
  }
  return best;
}

// Checks the gradient `grad` of loss() with respect to x: 4 random directions and 6
// single coordinates (the first: the largest gradient).
void check_gradient(const char* what, const std::function<double()>& loss, std::vector<float>& x,
                    const std::vector<float>& grad, uint32_t seed) {
  ASSERT_EQ(x.size(), grad.size());
  std::mt19937 rng(seed);
  double max_abs = 0;
  for (float g : grad) max_abs = std::max(max_abs, double(std::fabs(g)));
  for (int trial = 0; trial < 10; ++trial) {
    std::vector<float> dir(x.size(), 0.0f);
    if (trial < 4) {
      dir = randn(x.size(), seed * 31 + uint32_t(trial));
      double n = 0;
      for (float d : dir) n += double(d) * d;
      for (float& d : dir) d = float(d / std::sqrt(n));
    } else {
      // The coordinate with a large gradient first, then random ones.
      size_t i = std::uniform_int_distribution<size_t>(0, x.size() - 1)(rng);
      if (trial == 4)
        for (size_t j = 0; j < grad.size(); ++j)
          if (std::fabs(grad[j]) > std::fabs(grad[i])) i = j;
      dir[i] = 1.0f;
    }
    double analytic = 0;
    for (size_t i = 0; i < x.size(); ++i) analytic += double(grad[i]) * dir[i];
    // A coordinate whose gradient is below 1e-3 of the largest one is left out: there the
    // F32 rounding of the loss, not the gradient, decides the finite difference.
    if (trial >= 5 && std::fabs(analytic) < 1e-3 * max_abs) continue;
    const double err = best_relative_error(loss, x, dir, analytic);
    EXPECT_LE(err, 1e-3) << what << ": trial " << trial << " analytic " << analytic;
  }
}

}  // namespace

TEST(TrainOps, RmsNorm) {
  const int64_t rows = 3, n = 48;
  auto x = randn(size_t(rows * n), 1);
  auto w = randn(size_t(n), 2, 0.5f);
  for (float& v : w) v += 1.0f;
  const auto c = randn(size_t(rows * n), 3);
  std::vector<float> y(x.size()), inv(static_cast<size_t>(rows)), dx(x.size());
  auto loss = [&] {
    rms_norm_forward(x.data(), w.data(), y.data(), inv.data(), rows, n, 1e-5f);
    return project(y, c);
  };
  loss();
  rms_norm_backward(x.data(), w.data(), inv.data(), c.data(), dx.data(), rows, n, false);
  check_gradient("rms_norm", loss, x, dx, 4);
  // accumulate adds to what is there.
  loss();
  std::vector<float> acc(x.size(), 1.0f);
  rms_norm_backward(x.data(), w.data(), inv.data(), c.data(), acc.data(), rows, n, true);
  for (size_t i = 0; i < acc.size(); ++i) EXPECT_NEAR(acc[i], dx[i] + 1.0f, 1e-5);
}

TEST(TrainOps, RopePartialRotation) {
  // Head dim 16, rotating 8 of them (a full-attention layer's partial rotation), with
  // frequency factors; the 8 unrotated dims must pass the gradient through unchanged.
  const int64_t rows = 5, heads = 3, D = 16;
  const int32_t n_rot = 8;
  std::vector<int32_t> pos = {0, 3, 7, 100, 4095};
  const std::vector<float> ff = {1.0f, 1.5f, 2.0f, 2.0f};
  const auto tab = rope_table(pos.data(), rows, n_rot, 10000.0f, ff.data());
  auto x = randn(size_t(rows * heads * D), 5);
  const auto c = randn(x.size(), 6);
  std::vector<float> y;
  auto loss = [&] {
    y = x;
    rope_forward(y.data(), rows, heads, D, n_rot / 2, tab.data());
    return project(y, c);
  };
  std::vector<float> dx = c;
  rope_backward(dx.data(), rows, heads, D, n_rot / 2, tab.data());
  check_gradient("rope", loss, x, dx, 7);
  for (int64_t r = 0; r < rows * heads; ++r)
    for (int64_t i = n_rot; i < D; ++i) EXPECT_EQ(dx[size_t(r * D + i)], c[size_t(r * D + i)]);
}

namespace {

void check_attention(int32_t window, int64_t H, int64_t G, uint32_t seed) {
  AttentionShape s{9, H, G, 8, 6, window};
  auto q = randn(size_t(s.n * H * s.D), seed);
  auto k = randn(size_t(s.n * G * s.D), seed + 1);
  auto v = randn(size_t(s.n * G * s.Dv), seed + 2);
  const auto c = randn(size_t(s.n * H * s.Dv), seed + 3);
  std::vector<float> out(c.size()), lse(size_t(s.n * H));
  auto loss = [&] {
    attention_forward(s, q.data(), k.data(), v.data(), out.data(), lse.data());
    return project(out, c);
  };
  loss();
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  attention_backward(s, q.data(), k.data(), v.data(), out.data(), lse.data(), c.data(), dq.data(), dk.data(), dv.data());
  check_gradient("attention q", loss, q, dq, seed + 4);
  check_gradient("attention k", loss, k, dk, seed + 5);
  check_gradient("attention v", loss, v, dv, seed + 6);
  // Calls split by KV head and by row ranges (as threads take them) give the same result.
  loss();
  std::vector<float> out2(out.size(), 7.0f), lse2(lse.size(), 7.0f);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t t0 = 0; t0 < s.n; t0 += 4)
      attention_forward(s, q.data(), k.data(), v.data(), out2.data(), lse2.data(), g, t0, std::min(s.n, t0 + 4));
  EXPECT_EQ(out, out2);
  EXPECT_EQ(lse, lse2);
  std::vector<float> dq2(q.size(), 7.0f), dk2(k.size(), 7.0f), dv2(v.size(), 7.0f);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r0 = 0; r0 < s.n; r0 += 4) {
      const int64_t r1 = std::min(s.n, r0 + 4);
      attention_backward_queries(s, q.data(), k.data(), v.data(), out.data(), lse.data(), c.data(), dq2.data(), g, r0,
                                 r1);
      attention_backward_keys(s, q.data(), k.data(), v.data(), out.data(), lse.data(), c.data(), dk2.data(),
                              dv2.data(), g, r0, r1);
    }
  EXPECT_EQ(dq, dq2);
  EXPECT_EQ(dk, dk2);
  EXPECT_EQ(dv, dv2);
}

}  // namespace

TEST(TrainOps, AttentionFullCausal) { check_attention(0, 4, 2, 10); }
TEST(TrainOps, AttentionSlidingWindowGqa) { check_attention(3, 6, 2, 20); }
TEST(TrainOps, AttentionOneKvHead) { check_attention(0, 3, 1, 30); }

TEST(TrainOps, AttentionMatchesNaiveSoftmax) {
  // The forward itself: causal + window mask and GQA head mapping against a naive
  // reference (the whole-model test compares with the engine too).
  AttentionShape s{7, 4, 2, 5, 3, 3};
  const auto q = randn(size_t(s.n * s.H * s.D), 40), k = randn(size_t(s.n * s.G * s.D), 41),
             v = randn(size_t(s.n * s.G * s.Dv), 42);
  std::vector<float> out(size_t(s.n * s.H * s.Dv)), lse(size_t(s.n * s.H));
  attention_forward(s, q.data(), k.data(), v.data(), out.data(), lse.data());
  for (int64_t t = 0; t < s.n; ++t)
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t g = h / (s.H / s.G);
      std::vector<double> p;
      double mx = -INFINITY;
      for (int64_t u = 0; u <= t; ++u) {
        double d = 0;
        for (int64_t i = 0; i < s.D; ++i) d += double(q[size_t((t * s.H + h) * s.D + i)]) * k[size_t((u * s.G + g) * s.D + i)];
        d /= std::sqrt(double(s.D));
        if (t - u >= s.window) d = -INFINITY;
        p.push_back(d);
        mx = std::max(mx, d);
      }
      double z = 0;
      for (double& x : p) z += (x = std::exp(x - mx));
      for (int64_t i = 0; i < s.Dv; ++i) {
        double o = 0;
        for (int64_t u = 0; u <= t; ++u) o += p[size_t(u)] / z * v[size_t((u * s.G + g) * s.Dv + i)];
        EXPECT_NEAR(out[size_t((t * s.H + h) * s.Dv + i)], o, 1e-5);
      }
    }
}

namespace {

void check_swiglu(float limit, uint32_t seed) {
  const int64_t rows = 4, n = 24, ld = 24;
  auto g = randn(size_t(rows * ld), seed, 2.0f);
  auto u = randn(size_t(rows * ld), seed + 1, 2.0f);
  const auto c = randn(size_t(rows * n), seed + 2);
  std::vector<float> act(size_t(rows * n));
  auto loss = [&] {
    swiglu_forward(g.data(), u.data(), ld, limit, rows, n, act.data());
    return project(act, c);
  };
  loss();
  std::vector<float> dg(g.size()), du(u.size());
  swiglu_backward(g.data(), u.data(), ld, limit, rows, n, c.data(), dg.data(), du.data());
  check_gradient("swiglu gate", loss, g, dg, seed + 3);
  check_gradient("swiglu up", loss, u, du, seed + 4);
  if (limit > 0) {
    int clamped = 0;
    for (size_t i = 0; i < u.size(); ++i)
      if (std::fabs(u[i]) > limit) {
        EXPECT_EQ(du[i], 0.0f);
        ++clamped;
      }
    EXPECT_GT(clamped, 0) << "the test data should exercise the clamp";
  }
}

}  // namespace

TEST(TrainOps, SwiGlu) { check_swiglu(0.0f, 50); }
TEST(TrainOps, SwiGluClamped) { check_swiglu(1.5f, 60); }

TEST(TrainOps, HeadGate) {
  const int64_t rows = 3, H = 4, Dv = 5;
  auto graw = randn(size_t(rows * H), 70);
  auto o = randn(size_t(rows * H * Dv), 71);
  const auto c = randn(o.size(), 72);
  std::vector<float> out(o.size());
  auto loss = [&] {
    head_gate_forward(graw.data(), o.data(), out.data(), rows, H, Dv);
    return project(out, c);
  };
  std::vector<float> dg(graw.size()), d_o(o.size());
  head_gate_backward(graw.data(), o.data(), c.data(), dg.data(), d_o.data(), rows, H, Dv);
  check_gradient("gate logits", loss, graw, dg, 73);
  check_gradient("gated values", loss, o, d_o, 74);
}

namespace {

void check_router(RouterConfig rc, bool with_bias, uint32_t seed) {
  auto z = randn(size_t(rc.n_expert), seed, 1.5f);
  const auto bias = randn(size_t(rc.n_expert), seed + 1, 0.3f);
  const auto c = randn(size_t(rc.k), seed + 2);
  std::vector<float> p(size_t(rc.n_expert)), w(size_t(rc.k));
  std::vector<int32_t> ids(size_t(rc.k)), ids0;
  auto loss = [&] {
    router_forward(rc, z.data(), with_bias ? bias.data() : nullptr, p.data(), ids.data(), w.data());
    return project(w, c);
  };
  loss();
  ids0 = ids;
  std::vector<float> dz(z.size(), 0.0f);
  router_backward(rc, p.data(), ids.data(), c.data(), dz.data());
  check_gradient("router", loss, z, dz, seed + 3);
  loss();
  EXPECT_EQ(ids, ids0);
  // The weights: normalised weights sum to the scale.
  if (rc.normalize) {
    double s = 0;
    for (float x : w) s += x;
    EXPECT_NEAR(s, rc.scale, 1e-5);
  }
}

}  // namespace

TEST(TrainOps, RouterSigmoidNormalisedScaled) { check_router({16, 4, true, true, 3.0f}, true, 80); }
TEST(TrainOps, RouterSigmoidUnnormalised) { check_router({8, 2, true, false, 2.5f}, true, 90); }
TEST(TrainOps, RouterSoftmax) { check_router({8, 3, false, true, 1.0f}, false, 100); }

TEST(TrainOps, RouterSelectionUsesBiasWeightsDoNot) {
  // Bias decides which experts; the weights are the unbiased probabilities.
  RouterConfig rc{4, 2, true, false, 1.0f};
  const std::vector<float> z = {2.0f, 1.0f, 0.0f, -1.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f, 5.0f};
  std::vector<float> p(4), w(2);
  std::vector<int32_t> ids(2);
  router_forward(rc, z.data(), bias.data(), p.data(), ids.data(), w.data());
  EXPECT_EQ(ids[0], 3);
  EXPECT_EQ(ids[1], 0);
  EXPECT_FLOAT_EQ(w[0], 1.0f / (1.0f + std::exp(1.0f)));
}

TEST(TrainOps, BalanceLoss) {
  for (bool sigmoid : {true, false}) {
    RouterConfig rc{8, 2, sigmoid, true, 1.0f};
    const int64_t T = 6;
    auto z = randn(size_t(T * rc.n_expert), 110, 1.5f);
    std::vector<float> p(z.size()), w(size_t(T * rc.k));
    std::vector<int32_t> ids(size_t(T * rc.k)), ids0;
    // The selections (f_g) are constants of the loss: route once, keep them.
    for (int64_t t = 0; t < T; ++t)
      router_forward(rc, z.data() + t * 8, nullptr, p.data() + t * 8, ids.data() + t * 2, w.data() + t * 2);
    ids0 = ids;
    auto loss = [&] {
      for (int64_t t = 0; t < T; ++t)
        router_forward(rc, z.data() + t * 8, nullptr, p.data() + t * 8, ids.data() + t * 2, w.data() + t * 2);
      return balance_loss(rc, 4, p.data(), ids0.data(), T, 1.0f, nullptr);
    };
    const double L = loss();
    EXPECT_GT(L, 0.0);
    std::vector<float> dz(z.size(), 0.0f);
    balance_loss(rc, 4, p.data(), ids0.data(), T, 1.0f, dz.data());
    check_gradient(sigmoid ? "balance (sigmoid)" : "balance (softmax)", loss, z, dz, 111);
  }
  // Perfectly uniform routing and probabilities give L = 1.
  RouterConfig rc{4, 1, false, false, 1.0f};
  std::vector<float> p(16, 0.25f);
  std::vector<int32_t> ids = {0, 1, 2, 3};
  EXPECT_NEAR(balance_loss(rc, 4, p.data(), ids.data(), 4, 1.0f, nullptr), 1.0, 1e-9);
}

TEST(TrainOps, CrossEntropy) {
  const int64_t rows = 4, V = 11;
  auto l = randn(size_t(rows * V), 120, 2.0f);
  const std::vector<int32_t> targets = {3, -1, 0, 10};
  std::vector<double> row_loss(static_cast<size_t>(rows));
  auto loss = [&] {
    cross_entropy(l.data(), targets.data(), rows, V, row_loss.data(), nullptr, 1.0f);
    double s = 0;
    for (double x : row_loss) s += x;
    return s / 3.0;
  };
  std::vector<float> dl(l.size());
  cross_entropy(l.data(), targets.data(), rows, V, row_loss.data(), dl.data(), 1.0f / 3.0f);
  EXPECT_EQ(row_loss[1], 0.0);
  for (int64_t i = 0; i < V; ++i) EXPECT_EQ(dl[size_t(V + i)], 0.0f);
  check_gradient("cross-entropy", loss, l, dl, 121);
  // Uniform logits: loss log V.
  std::vector<float> flat(size_t(V), 0.5f);
  const int32_t y = 2;
  double one = 0;
  cross_entropy(flat.data(), &y, 1, V, &one, nullptr, 1.0f);
  EXPECT_NEAR(one, std::log(double(V)), 1e-9);
}

TEST(TrainOps, LinearProductsOfQuantizedWeights) {
  // Forward, input gradient and weight gradient of y = W x, W stored as Q8_0 (dequantized
  // block by block) and as F32, against a naive reference; and a finite-difference check
  // of the input gradient through the quantized matrix.
  const int64_t n_in = 64, n_out = 40, T = 5;
  const auto wf = randn(size_t(n_in * n_out), 130, 0.2f);
  std::vector<uint8_t> q8(size_t(n_out) * (size_t(n_in) / 32) * sizeof(BlockQ8_0));
  for (int64_t o = 0; o < n_out; ++o)
    ASSERT_TRUE(quantize_row_ref(DType::Q8_0, wf.data() + o * n_in, q8.data() + size_t(o) * (n_in / 32) * 34, n_in));
  WeightMatrix wq;
  wq.data = q8.data();
  wq.type = DType::Q8_0;
  wq.n_in = n_in;
  wq.n_out = n_out;
  wq.row_bytes = size_t(n_in / 32) * 34;
  std::vector<float> deq(wf.size());
  for (int64_t o = 0; o < n_out; ++o) dequantize_row(wq, o, deq.data() + o * n_in);

  auto x = randn(size_t(T * n_in), 131);
  const auto c = randn(size_t(T * n_out), 132);
  ThreadPool pool(2);
  for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
    std::vector<float> y(size_t(T * n_out));
    linear_forward(wq, x.data(), n_in, T, y.data(), n_out, tp);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < n_out; ++o) {
        double r = 0;
        for (int64_t i = 0; i < n_in; ++i) r += double(deq[size_t(o * n_in + i)]) * x[size_t(t * n_in + i)];
        EXPECT_NEAR(y[size_t(t * n_out + o)], r, 1e-4);
      }
    std::vector<float> dx(x.size(), 0.0f);
    linear_backward_input(wq, c.data(), n_out, T, dx.data(), n_in, tp);
    auto loss = [&] {
      linear_forward(wq, x.data(), n_in, T, y.data(), n_out, nullptr);
      return project(y, c);
    };
    check_gradient("linear input (q8_0)", loss, x, dx, 133);

    // Weight gradient of an F32 matrix.
    auto wt = wf;
    std::vector<float> g(wt.size(), 0.0f);
    linear_backward_weight(x.data(), n_in, c.data(), n_out, T, n_in, n_out, g.data(), tp);
    auto loss_w = [&] {
      linear_forward(f32_matrix(wt.data(), n_in, n_out), x.data(), n_in, T, y.data(), n_out, nullptr);
      return project(y, c);
    };
    check_gradient("linear weight (f32)", loss_w, wt, g, 134);
  }
}

TEST(TrainOps, LinearResultsDoNotDependOnThreads) {
  const int64_t n_in = 96, n_out = 70, T = 37;
  const auto w = randn(size_t(n_in * n_out), 140);
  const auto x = randn(size_t(T * n_in), 141);
  const auto dy = randn(size_t(T * n_out), 142);
  const WeightMatrix wm = f32_matrix(w.data(), n_in, n_out);
  std::vector<float> y1(size_t(T * n_out)), y2 = y1, dx1(x.size(), 0.0f), dx2 = dx1, g1(w.size(), 0.0f), g2 = g1;
  ThreadPool pool(3);
  linear_forward(wm, x.data(), n_in, T, y1.data(), n_out, nullptr);
  linear_forward(wm, x.data(), n_in, T, y2.data(), n_out, &pool);
  linear_backward_input(wm, dy.data(), n_out, T, dx1.data(), n_in, nullptr);
  linear_backward_input(wm, dy.data(), n_out, T, dx2.data(), n_in, &pool);
  linear_backward_weight(x.data(), n_in, dy.data(), n_out, T, n_in, n_out, g1.data(), nullptr);
  linear_backward_weight(x.data(), n_in, dy.data(), n_out, T, n_in, n_out, g2.data(), &pool);
  EXPECT_EQ(y1, y2);
  EXPECT_EQ(dx1, dx2);
  EXPECT_EQ(g1, g2);
}
