// KV cache rows in and out of a head block, query conversion and the Walsh-Hadamard
// rotation (the same code on every ISA level: they run once per token and head, not per
// key), and the dispatch of the per-block attention kernels to the level in use.
#include "tensor/kv_kernels.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/kernels_impl.h"
#include "tensor/kv_layout.h"
#include "tensor/quants.h"
#include "tensor/type_traits.h"

namespace step35::kernels {

namespace {

void require_type(DType t, int64_t d, const char* what) {
  if (!kv_type_supported(t))
    throw std::invalid_argument(std::string(what) + ": " + dtype_name(t) + " is not a KV cache type");
  if (d <= 0 || d % dtype_info(t).block_elems != 0)
    throw std::invalid_argument(std::string(what) + ": row of " + std::to_string(d) + " is not a multiple of " +
                                dtype_name(t) + "'s block");
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

}  // namespace

bool kv_type_supported(DType t) {
  const TypeTraits* tt = type_traits(uint32_t(t));
  return tt && tt->kv != KvRole::None;
}

bool kv_type_quantized(DType t) {
  const TypeTraits* tt = type_traits(uint32_t(t));
  return tt && tt->kv == KvRole::Int;
}

void kv_store_key(DType t, const float* x, int64_t d, uint8_t* block, int32_t bs, int32_t slot) {
  require_type(t, d, "kv_store_key");
  if (!kv_type_quantized(t)) {
    // Float keys, dimension-major: element i of slot j at (i·bs + j) elements (F32 copied,
    // F16 / BF16 rounded to nearest even). Written out per type: this runs for every key of
    // every prompt token, and a call per element through the type's row encoder showed in
    // prefill (paired pp512 on the benchmark model: 0.986 of the build before, 1.019 with
    // these loops).
    uint8_t* at = block + size_t(slot) * type_traits(t).block_bytes;
    const size_t stride = size_t(bs) * type_traits(t).block_bytes;
    if (t == DType::F16) {
      for (int64_t i = 0; i < d; ++i) store_u16(at + size_t(i) * stride, fp32_to_fp16(x[i]));
    } else if (t == DType::BF16) {
      for (int64_t i = 0; i < d; ++i) store_u16(at + size_t(i) * stride, fp32_to_bf16(x[i]));
    } else {
      for (int64_t i = 0; i < d; ++i) std::memcpy(at + size_t(i) * stride, &x[i], 4);
    }
    return;
  }
  uint8_t* ints = block + key_scale_bytes(d, bs);
  for (int64_t b = 0; b < d / 32; ++b) {
    if (t == DType::Q8_0) {
      ActQ8_0 q;
      active_table().quantize_q8_0(x + 32 * b, &q, 32);  // the cache writer's encoder (ggml x86 quantize_row_q8_0)
      store_u16(block + (size_t(b) * size_t(bs) + size_t(slot)) * 2, q.d);
      for (int e = 0; e < 32; ++e)
        ints[key_q8_index(32 * b + e, slot, bs)] = uint8_t(int32_t(q.qs[e]) + kKeyOffsetQ8_0);
    } else {  // Q4_0
      BlockQ4_0 q;
      quantize_row_ref(DType::Q4_0, x + 32 * b, &q, 32);  // ggml's quantize_row_q4_0_ref
      store_u16(block + (size_t(b) * size_t(bs) + size_t(slot)) * 2, q.d);
      for (int e = 0; e < 32; ++e) {
        const int64_t i = 32 * b + e;
        const uint8_t n = e < 16 ? (q.qs[e] & 15) : (q.qs[e - 16] >> 4);
        uint8_t& byte = ints[key_q4_index(i, slot, bs)];
        byte = key_q4_high(i) ? uint8_t((byte & 0x0F) | (n << 4)) : uint8_t((byte & 0xF0) | n);
      }
    }
  }
}

void kv_load_key(DType t, const uint8_t* block, int32_t bs, int32_t slot, int64_t d, float* out) {
  require_type(t, d, "kv_load_key");
  if (!kv_type_quantized(t)) {
    const TypeTraits& tt = type_traits(t);
    for (int64_t i = 0; i < d; ++i) tt.dequantize(block + (size_t(i) * size_t(bs) + size_t(slot)) * tt.block_bytes, &out[i], 1);
    return;
  }
  const uint8_t* ints = block + key_scale_bytes(d, bs);
  for (int64_t i = 0; i < d; ++i) {
    const float scale = fp16_to_fp32(load_u16(block + (size_t(i / 32) * size_t(bs) + size_t(slot)) * 2));
    int32_t q;
    if (t == DType::Q8_0) {
      q = int32_t(ints[key_q8_index(i, slot, bs)]) - kKeyOffsetQ8_0;
    } else {
      const uint8_t byte = ints[key_q4_index(i, slot, bs)];
      q = int32_t(key_q4_high(i) ? byte >> 4 : byte & 15) - kKeyOffsetQ4_0;
    }
    out[i] = float(q) * scale;
  }
}

void kv_store_value(DType t, const float* x, int64_t d, uint8_t* block, int32_t bs, int32_t slot) {
  require_type(t, d, "kv_store_value");
  (void)bs;
  uint8_t* row = block + size_t(slot) * *row_bytes(t, d);
  if (t == DType::Q8_0) {
    active_table().quantize_q8_0(x, reinterpret_cast<ActQ8_0*>(row), d);  // same bytes as a BlockQ8_0 row
    return;
  }
  quantize_row_ref(t, x, row, d);  // F32 copy, F16/BF16 round to nearest even, Q4_0 reference
}

void kv_load_value(DType t, const uint8_t* block, int32_t bs, int32_t slot, int64_t d, float* out) {
  require_type(t, d, "kv_load_value");
  (void)bs;
  dequantize_row_ref(t, block + size_t(slot) * *row_bytes(t, d), out, d);
}

size_t attn_query_bytes(DType t, int64_t d) {
  require_type(t, d, "attn_query_bytes");
  if (kv_type_quantized(t)) return size_t(d / 32) * sizeof(QueryQ8);
  return size_t(d) * sizeof(float);
}

void attn_convert_query(DType t, const float* q, int64_t d, uint8_t* dst) {
  require_type(t, d, "attn_convert_query");
  if (kv_type_quantized(t)) {
    auto* out = reinterpret_cast<QueryQ8*>(dst);
    for (int64_t b = 0; b < d / 32; ++b) {
      ActQ8_0 a;
      active_table().quantize_q8_0(q + 32 * b, &a, 32);
      out[b].d = fp16_to_fp32(a.d);
      int32_t sum = 0;
      for (int e = 0; e < 32; ++e) sum += a.qs[e];
      out[b].sum = sum;
      std::memcpy(out[b].qs, a.qs, 32);
    }
    return;
  }
  auto* out = reinterpret_cast<float*>(dst);
  if (t == DType::BF16) {
    for (int64_t i = 0; i < d; ++i) out[i] = bf16_to_fp32(fp32_to_bf16(q[i]));
  } else {
    std::memcpy(out, q, size_t(d) * sizeof(float));
  }
}

void attn_query_values(DType t, const uint8_t* converted, int64_t d, float* out) {
  require_type(t, d, "attn_query_values");
  if (kv_type_quantized(t)) {
    const auto* blocks = reinterpret_cast<const QueryQ8*>(converted);
    for (int64_t i = 0; i < d; ++i) out[i] = blocks[i / 32].d * float(blocks[i / 32].qs[i % 32]);
  } else {
    std::memcpy(out, converted, size_t(d) * sizeof(float));
  }
}

void attn_scores(DType t, const uint8_t* q, size_t q_stride, int64_t n_q, const uint8_t* block, int32_t bs,
                 int32_t n_k, int64_t d, float scale, float* s, int64_t s_stride) {
  active_table().kv_scores(t, q, q_stride, n_q, block, bs, n_k, d, scale, s, s_stride);
}

float attn_exp_sum(float* s, int64_t n, float m) { return active_table().kv_exp_sum(s, n, m); }

float attn_row_max(const float* s, int64_t n) { return active_table().kv_max(s, n); }

void attn_accumulate(DType t, const float* p, int64_t p_stride, int64_t n_q, const uint8_t* block, int32_t n_k,
                     int64_t d, float* acc, int64_t acc_stride) {
  active_table().kv_accumulate(t, p, p_stride, n_q, block, n_k, d, acc, acc_stride);
}

void hadamard_rows(float* x, int64_t len, int64_t n) {
  if (n < 1 || (n & (n - 1)) != 0 || len % n != 0)
    throw std::invalid_argument("hadamard_rows: chunk " + std::to_string(n) + " is not a power of two dividing " +
                                std::to_string(len));
  if (const auto h = active_table().hadamard_rows; h && n >= 8) return h(x, len, n);
  const float scale = 1.0f / std::sqrt(float(n));
  for (int64_t r = 0; r < len; r += n) {
    float* y = x + r;
    for (int64_t j = 0; j < n; ++j) y[j] *= scale;  // ggml scales first, then the butterflies
    for (int64_t half = 1; half < n; half <<= 1)
      for (int64_t i = 0; i < n; i += 2 * half)
        for (int64_t j = i; j < i + half; ++j) {
          const float u = y[j], v = y[j + half];
          y[j] = u + v;
          y[j + half] = u - v;
        }
  }
}

}  // namespace step35::kernels
