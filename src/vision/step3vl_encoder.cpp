#include "vision/step3vl_encoder.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "exec/thread_pool.h"
#include "gguf/gguf.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/quants.h"

namespace step35::vision {

namespace {

std::string shape_of(const gguf::TensorInfo& t) {
  std::string s = "{";
  for (uint32_t d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "}";
}

// Binds the mmproj's tensors, checking names, shapes and types.
struct Binder {
  const gguf::File& f;
  int64_t n_params = 0;

  const gguf::TensorInfo& find(const std::string& name, std::vector<int64_t> shape) {
    const gguf::TensorInfo* t = f.find_tensor(name);
    if (!t) throw std::invalid_argument(f.path() + ": missing tensor '" + name + "' (not a step3vl mmproj?)");
    for (size_t d = 0; d < 4; ++d)
      if (t->ne[d] != (d < shape.size() ? shape[d] : 1)) {
        std::string want = "{";
        for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
        throw std::invalid_argument(f.path() + ": tensor '" + name + "' has shape " + shape_of(*t) + " (expected " +
                                    want + "})");
      }
    int64_t n = 1;
    for (int64_t e : shape) n *= e;
    n_params += n;
    return *t;
  }
  // A matrix of `n_out` rows of `n_in` (the leading dimensions folded into rows).
  WeightMatrix matrix(const std::string& name, std::vector<int64_t> shape) {
    const gguf::TensorInfo& t = find(name, shape);
    const DType type = DType(t.type);
    if (type != DType::F32 && type != DType::F16 && type != DType::BF16 && type != DType::Q8_0)
      throw std::invalid_argument(f.path() + ": tensor '" + name + "' is " + dtype_name(type) +
                                  " (the vision tower runs F32, F16, BF16 and Q8_0)");
    WeightMatrix w;
    w.data = t.data;
    w.type = type;
    w.n_out = shape.back();
    w.n_in = 1;
    for (size_t d = 0; d + 1 < shape.size(); ++d) w.n_in *= shape[d];
    const auto rb = row_bytes(type, w.n_in);
    if (!rb) throw std::invalid_argument(f.path() + ": tensor '" + name + "': rows of " + std::to_string(w.n_in) +
                                         " do not fit " + dtype_name(type) + " blocks");
    w.row_bytes = *rb;
    return w;
  }
  std::vector<float> floats(const std::string& name, std::vector<int64_t> shape) {
    const gguf::TensorInfo& t = find(name, shape);
    int64_t n = 1;
    for (int64_t e : shape) n *= e;
    std::vector<float> v(static_cast<size_t>(n));
    const auto rb = row_bytes(DType(t.type), shape[0]);
    if (!rb) throw std::invalid_argument(f.path() + ": tensor '" + name + "' cannot be read as rows");
    for (int64_t r = 0; r < n / shape[0]; ++r)
      dequantize_row_ref(DType(t.type), t.data + size_t(r) * *rb, v.data() + r * shape[0], shape[0]);
    return v;
  }
};

// y[t][o] = W x_t (+ bias) for n rows of x, output rows split over the pool.
void linear(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool& pool,
            const std::vector<float>* bias = nullptr) {
  const kernels::ActType at = kernels::act_type(w.type, Precision::Native);
  const size_t stride = kernels::act_row_bytes(at, w.n_in);
  std::vector<uint8_t> act(stride * size_t(n));
  kernels::convert_activations(at, x, n, w.n_in, w.n_in, act.data());
  kernels::ActRows rows;
  rows.type = at;
  rows.data = act.data();
  rows.stride = stride;
  rows.n_tok = n;
  const int64_t g = kernels::row_granularity(w), n_groups = (w.n_out + g - 1) / g;
  pool.parallel_for(n_groups, [&](int64_t b, int64_t e, int) {
    if (b < e) kernels::matmul(w, b * g, std::min(w.n_out, e * g), rows, y, w.n_out);
  });
  if (bias)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < w.n_out; ++o) y[t * w.n_out + o] += (*bias)[size_t(o)];
}

// ggml's LayerNorm order: mean and variance summed in double, y = (x - mean) * scale * w + b.
void layer_norm(const float* x, int64_t n_rows, int64_t n, const std::vector<float>& w, const std::vector<float>& b,
                float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += xr[i];
    const float mean = float(sum / double(n));
    double sum2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float v = xr[i] - mean;
      yr[i] = v;
      sum2 += double(v * v);
    }
    const float scale = 1.0f / std::sqrt(float(sum2 / double(n)) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = yr[i] * scale * w[size_t(i)] + b[size_t(i)];
  }
}

// gelu_quick as ggml's CPU backend computes it: through a table over every F16 input, the
// result rounded to F16 (x * sigmoid(1.702 x) in F32 before rounding).
float gelu_quick(float x) {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(1 << 16);
    for (uint32_t i = 0; i < t.size(); ++i) {
      const float v = fp16_to_fp32(uint16_t(i));
      t[i] = fp32_to_fp16(v * (1.0f / (1.0f + std::exp(-1.702f * v))));
    }
    return t;
  }();
  return fp16_to_fp32(table[fp32_to_fp16(x)]);
}

// The position table, one channel plane at a time, resized from side_in^2 to side_out^2 by
// ggml's bilinear interpolation with antialiasing (a triangle filter whose support widens
// when shrinking, weights normalised over the pixels it covers; half-pixel centres).
std::vector<float> resize_positions(const std::vector<float>& table, int32_t side_in, int32_t side_out, int32_t width) {
  std::vector<float> out(size_t(side_out) * size_t(side_out) * size_t(width));
  const float sf = float(side_out) / float(side_in);
  const float support = std::max(1.0f, 1.0f / sf), invscale = 1.0f / support;
  auto tri = [](float v) { return std::max(1.0f - std::fabs(v), 0.0f); };
  for (int32_t oy = 0; oy < side_out; ++oy)
    for (int32_t ox = 0; ox < side_out; ++ox) {
      const float y = (float(oy) + 0.5f) / sf, x = (float(ox) + 0.5f) / sf;
      const int64_t x0 = std::max<int64_t>(int64_t(x - support + 0.5f), 0);
      const int64_t x1 = std::min<int64_t>(int64_t(x + support + 0.5f), side_in);
      const int64_t y0 = std::max<int64_t>(int64_t(y - support + 0.5f), 0);
      const int64_t y1 = std::min<int64_t>(int64_t(y + support + 0.5f), side_in);
      for (int32_t c = 0; c < width; ++c) {
        float val = 0.0f, total = 0.0f;
        for (int64_t sy = y0; sy < y1; ++sy) {
          const float wy = tri((float(sy) - y + 0.5f) * invscale);
          for (int64_t sx = x0; sx < x1; ++sx) {
            const float wgt = tri((float(sx) - x + 0.5f) * invscale) * wy;
            if (wgt <= 0.0f) continue;
            val += table[size_t(sy * side_in + sx) * size_t(width) + size_t(c)] * wgt;
            total += wgt;
          }
        }
        out[(size_t(oy) * size_t(side_out) + size_t(ox)) * size_t(width) + size_t(c)] = total > 0.0f ? val / total : val;
      }
    }
  return out;
}

// Adjacent-pair RoPE over n_dims dims of x at position pos (ggml's "normal" mode).
void rope_pairs(float* x, int32_t n_dims, float pos, float base) {
  const float theta_scale = std::pow(base, -2.0f / float(n_dims));
  float theta = pos;
  for (int32_t i = 0; i < n_dims; i += 2) {
    const float c = std::cos(theta), s = std::sin(theta);
    const float x0 = x[i], x1 = x[i + 1];
    x[i] = x0 * c - x1 * s;
    x[i + 1] = x0 * s + x1 * c;
    theta *= theta_scale;
  }
}

// Softmax attention of every head over all patches (no mask): qkv holds [N][q | k | v] rows
// of width W each, attn gets [N][W]. Blocks of queries per head, each through the engine's
// F32 attention kernels (tensor/kernels.h: scores, exp and sum, P·V), read in place.
void attend_heads(const std::vector<float>& qkv, int64_t N, int64_t W, int64_t n_head, std::vector<float>& attn,
                  ThreadPool& pool) {
  constexpr int64_t kQueryBlock = 32;
  const int64_t D = W / n_head, n_blocks = (N + kQueryBlock - 1) / kQueryBlock;
  const float kq_scale = 1.0f / std::sqrt(float(D));
  pool.parallel_for(n_head * n_blocks, [&](int64_t b, int64_t e, int) {
    std::vector<float> p(static_cast<size_t>(kQueryBlock * N));
    for (int64_t job = b; job < e; ++job) {
      const int64_t hh = job / n_blocks, i0 = (job % n_blocks) * kQueryBlock, n_q = std::min(kQueryBlock, N - i0);
      const float* q = &qkv[size_t(i0 * 3 * W + hh * D)];
      kernels::attn_scores(q, 3 * W, n_q, &qkv[size_t(W + hh * D)], 3 * W, N, D, kq_scale, p.data(), N);
      for (int64_t r = 0; r < n_q; ++r) {
        float* row = &p[size_t(r * N)];
        const float mx = *std::max_element(row, row + N);
        kernels::scale_f32(1.0f / kernels::exp_shift_sum(row, N, mx), row, N);
      }
      float* out = &attn[size_t(i0 * W + hh * D)];
      for (int64_t r = 0; r < n_q; ++r) std::fill(out + r * W, out + r * W + D, 0.0f);
      kernels::gemm_acc_f32(n_q, D, N, p.data(), N, 1, &qkv[size_t(2 * W + hh * D)], 3 * W, out, W);
    }
  });
}

// 3x3 / stride 2 / padding 1 patches of a [channels][side][side] map: one row of
// channels*9 (channel, ky, kx; kx fastest) per output pixel, row-major.
std::vector<float> im2col_3x3_s2(const std::vector<float>& map, int32_t channels, int32_t side, int32_t out_side) {
  std::vector<float> cols(size_t(out_side) * size_t(out_side) * size_t(channels) * 9, 0.0f);
  for (int32_t oy = 0; oy < out_side; ++oy)
    for (int32_t ox = 0; ox < out_side; ++ox) {
      float* row = &cols[(size_t(oy) * size_t(out_side) + size_t(ox)) * size_t(channels) * 9];
      for (int32_t c = 0; c < channels; ++c)
        for (int32_t ky = 0; ky < 3; ++ky)
          for (int32_t kx = 0; kx < 3; ++kx) {
            const int32_t ix = 2 * ox - 1 + kx, iy = 2 * oy - 1 + ky;
            if (ix >= 0 && iy >= 0 && ix < side && iy < side)
              row[size_t(c) * 9 + size_t(ky) * 3 + size_t(kx)] = map[(size_t(c) * size_t(side) + size_t(iy)) * size_t(side) + size_t(ix)];
          }
    }
  return cols;
}

// [n][channels] rows into a [channels][side][side] map.
std::vector<float> rows_to_planes(const std::vector<float>& rows, int32_t channels, int32_t side) {
  std::vector<float> map(rows.size());
  for (size_t p = 0; p < size_t(side) * size_t(side); ++p)
    for (int32_t c = 0; c < channels; ++c) map[size_t(c) * size_t(side) * size_t(side) + p] = rows[p * size_t(channels) + size_t(c)];
  return map;
}

// The same matrix in F16 (rounded to nearest), its rows in `store`.
void as_f16(WeightMatrix& w, std::vector<uint16_t>& store) {
  if (w.type == DType::F16) return;
  const int64_t K = w.n_in;
  std::vector<float> row(static_cast<size_t>(K));
  store.resize(size_t(K * w.n_out));
  for (int64_t o = 0; o < w.n_out; ++o) {
    dequantize_row_ref(w.type, w.row(o), row.data(), K);
    for (int64_t k = 0; k < K; ++k) store[size_t(o * K + k)] = fp32_to_fp16(row[size_t(k)]);
  }
  w.data = reinterpret_cast<const uint8_t*>(store.data());
  w.type = DType::F16;
  w.row_bytes = size_t(K) * 2;
}

}  // namespace

Step3vlEncoder::~Step3vlEncoder() = default;

std::unique_ptr<Step3vlEncoder> Step3vlEncoder::load(const std::string& path) {
  std::unique_ptr<Step3vlEncoder> e(new Step3vlEncoder());
  e->file_ = gguf::File::open(path);
  const gguf::File& f = *e->file_;
  const std::string arch = f.opt_str("general.architecture").value_or("");
  if (arch != "clip")
    throw std::invalid_argument(path + ": general.architecture is '" + arch + "', not an mmproj ('clip')");
  const std::string proj = f.opt_str("clip.projector_type").value_or("");
  if (proj != "step3vl")
    throw std::invalid_argument(path + ": projector type '" + proj + "' is not supported (step35 runs step3vl)");
  e->cfg_ = step3vl_config(f);
  e->width_ = int32_t(f.get_u32("clip.vision.embedding_length"));
  e->n_head_ = int32_t(f.get_u32("clip.vision.attention.head_count"));
  e->n_ff_ = int32_t(f.get_u32("clip.vision.feed_forward_length"));
  e->proj_dim_ = int32_t(f.get_u32("clip.vision.projection_dim"));
  e->eps_ = f.opt_f32("clip.vision.attention.layer_norm_epsilon").value_or(1e-5f);
  const int32_t n_layer = int32_t(f.get_u32("clip.vision.block_count"));
  const int64_t W = e->width_, F = e->n_ff_, P = e->cfg_.patch_size;
  if (W <= 0 || e->n_head_ <= 0 || W % e->n_head_ != 0 || (W / e->n_head_) % 4 != 0 || n_layer <= 0 || F <= 0)
    throw std::invalid_argument(path + ": embedding_length " + std::to_string(W) + " / head_count " +
                                std::to_string(e->n_head_) + " do not make heads the 2-D RoPE can take");
  Binder b{f};
  e->patch_embd_ = b.matrix("v.patch_embd.weight", {P, P, 3, W});
  // llama.cpp convolves the patches in F16 (kernel and pixels rounded to F16, F32 sums)
  // whatever the file's type: the kernel is kept as F16 here too, and matmul then rounds
  // the pixels (4.8e-7 from its patch embedding this way, 1e-3 in F32).
  // llama.cpp convolves the patches in F16 (kernel and pixels rounded to F16, F32 sums)
  // whatever the file's type: with the kernel in F16, matmul rounds the pixels the same way
  // (the patch embedding then lands within 5e-7 of llama.cpp's, 1e-3 in F32).
  as_f16(e->patch_embd_, e->patch_f16_);
  e->table_side_ = e->cfg_.image_size / e->cfg_.patch_size;
  e->pos_table_ = b.floats("v.position_embd.weight", {W, int64_t(e->table_side_) * e->table_side_});
  e->pre_ln_w_ = b.floats("v.pre_ln.weight", {W});
  e->pre_ln_b_ = b.floats("v.pre_ln.bias", {W});
  for (int32_t il = 0; il < n_layer; ++il) {
    const std::string p = "v.blk." + std::to_string(il) + ".";
    Block blk;
    blk.ln1_w = b.floats(p + "ln1.weight", {W});
    blk.ln1_b = b.floats(p + "ln1.bias", {W});
    blk.qkv = b.matrix(p + "attn_qkv.weight", {W, 3 * W});
    blk.qkv_b = b.floats(p + "attn_qkv.bias", {3 * W});
    blk.out = b.matrix(p + "attn_out.weight", {W, W});
    blk.out_b = b.floats(p + "attn_out.bias", {W});
    blk.ls1 = b.floats(p + "ls1.weight", {W});
    blk.ln2_w = b.floats(p + "ln2.weight", {W});
    blk.ln2_b = b.floats(p + "ln2.bias", {W});
    blk.up = b.matrix(p + "ffn_up.weight", {W, F});
    blk.up_b = b.floats(p + "ffn_up.bias", {F});
    blk.down = b.matrix(p + "ffn_down.weight", {F, W});
    blk.down_b = b.floats(p + "ffn_down.bias", {W});
    blk.ls2 = b.floats(p + "ls2.weight", {W});
    e->blocks_.push_back(std::move(blk));
  }
  const gguf::TensorInfo* c0 = f.find_tensor("mm.0.weight");
  if (!c0) throw std::invalid_argument(path + ": missing tensor 'mm.0.weight' (not a step3vl mmproj?)");
  e->conv0_out_ = int32_t(c0->ne[3]);
  e->conv0_ = b.matrix("mm.0.weight", {3, 3, W, e->conv0_out_});
  e->conv0_b_ = b.floats("mm.0.bias", {e->conv0_out_});
  const gguf::TensorInfo* c1 = f.find_tensor("mm.1.weight");
  const int64_t C1 = c1 ? c1->ne[3] : 0;
  e->conv1_ = b.matrix("mm.1.weight", {3, 3, e->conv0_out_, C1});
  e->conv1_b_ = b.floats("mm.1.bias", {C1});
  e->fc_ = b.matrix("mm.model.fc.weight", {C1, e->proj_dim_});
  // The two convolutions run in F16 as well (their outputs are 4x closer to llama.cpp's so).
  as_f16(e->conv0_, e->conv0_f16_);
  as_f16(e->conv1_, e->conv1_f16_);
  e->n_params_ = b.n_params;
  return e;
}

std::vector<float> Step3vlEncoder::encode(const PreparedChunk& chunk, ThreadPool& pool, EncoderTrace* trace) const {
  const int32_t S = chunk.side, P = cfg_.patch_size;
  if (S % (P * cfg_.merge) != 0 || chunk.pixels.size() != size_t(3) * size_t(S) * size_t(S))
    throw std::invalid_argument("vision: a chunk of " + std::to_string(S) + " pixels does not fit the tower");
  const int32_t G = S / P;  // patches per side
  const int64_t N = int64_t(G) * G, W = width_, D = W / n_head_;
  // Patch embedding: each 14x14x3 patch (channel, y, x; x fastest) times the kernel.
  std::vector<float> cols(size_t(N) * size_t(3 * P * P));
  for (int32_t py = 0; py < G; ++py)
    for (int32_t px = 0; px < G; ++px) {
      float* row = &cols[(size_t(py) * size_t(G) + size_t(px)) * size_t(3 * P * P)];
      for (int c = 0; c < 3; ++c)
        for (int32_t ky = 0; ky < P; ++ky)
          for (int32_t kx = 0; kx < P; ++kx) row[(size_t(c) * P + size_t(ky)) * P + size_t(kx)] = chunk.at(px * P + kx, py * P + ky, c);
    }
  std::vector<float> h(size_t(N * W));
  linear(patch_embd_, cols.data(), N, h.data(), pool);
  const std::vector<float> pos = G == table_side_ ? pos_table_ : resize_positions(pos_table_, table_side_, G, int32_t(W));
  for (size_t i = 0; i < h.size(); ++i) h[i] += pos[i];
  if (trace) trace->pos_embd_resized = pos, trace->pos_embed = h;
  std::vector<float> a(h.size());
  layer_norm(h.data(), N, W, pre_ln_w_, pre_ln_b_, eps_, h.data());

  std::vector<float> qkv(size_t(N * 3 * W)), attn(size_t(N * W)), o(size_t(N * W)), up(size_t(N) * size_t(n_ff_));
  for (const Block& blk : blocks_) {
    layer_norm(h.data(), N, W, blk.ln1_w, blk.ln1_b, eps_, a.data());
    linear(blk.qkv, a.data(), N, qkv.data(), pool, &blk.qkv_b);
    // 2-D RoPE: the first half of each head's dims turns with the patch's column, the
    // second half with its row.
    for (int64_t t = 0; t < N; ++t)
      for (int32_t part = 0; part < 2; ++part)  // q, then k
        for (int64_t hh = 0; hh < n_head_; ++hh) {
          float* v = &qkv[size_t(t * 3 * W + part * W + hh * D)];
          rope_pairs(v, int32_t(D / 2), float(t % G), 10000.0f);
          rope_pairs(v + D / 2, int32_t(D / 2), float(t / G), 10000.0f);
        }
    attend_heads(qkv, N, W, n_head_, attn, pool);
    linear(blk.out, attn.data(), N, o.data(), pool, &blk.out_b);
    for (int64_t t = 0; t < N; ++t)
      for (int64_t c = 0; c < W; ++c) h[size_t(t * W + c)] += o[size_t(t * W + c)] * blk.ls1[size_t(c)];
    layer_norm(h.data(), N, W, blk.ln2_w, blk.ln2_b, eps_, a.data());
    linear(blk.up, a.data(), N, up.data(), pool, &blk.up_b);
    for (float& v : up) v = gelu_quick(v);
    linear(blk.down, up.data(), N, o.data(), pool, &blk.down_b);
    for (int64_t t = 0; t < N; ++t)
      for (int64_t c = 0; c < W; ++c) h[size_t(t * W + c)] += o[size_t(t * W + c)] * blk.ls2[size_t(c)];
  }
  if (trace) trace->vit_out = h;

  // Two 3x3 stride-2 convolutions over the patch map, then the projector.
  const int32_t G0 = (G + 1) / 2, G1 = (G0 + 1) / 2;
  const int64_t C0 = conv0_out_, C1 = conv1_.n_out;
  std::vector<float> c0cols = im2col_3x3_s2(rows_to_planes(h, int32_t(W), G), int32_t(W), G, G0);
  std::vector<float> y0(size_t(G0) * size_t(G0) * size_t(C0));
  linear(conv0_, c0cols.data(), int64_t(G0) * G0, y0.data(), pool, &conv0_b_);
  std::vector<float> c1cols = im2col_3x3_s2(rows_to_planes(y0, int32_t(C0), G0), int32_t(C0), G0, G1);
  std::vector<float> y1(size_t(G1) * size_t(G1) * size_t(C1));
  linear(conv1_, c1cols.data(), int64_t(G1) * G1, y1.data(), pool, &conv1_b_);
  if (trace) trace->downsample_1 = rows_to_planes(y1, int32_t(C1), G1);
  std::vector<float> emb(size_t(G1) * size_t(G1) * size_t(proj_dim_));
  linear(fc_, y1.data(), int64_t(G1) * G1, emb.data(), pool);
  return emb;
}

}  // namespace step35::vision
