// The type traits table: one row per supported ggml type holding everything the engine
// decides by type: the block geometry and name (DTypeInfo), the reference row kernels
// (dequantize, dot product against F32, encoder where there is one), the activation format
// its native dot product consumes, the integer decoder of the IQ / TQ super-block types, the
// repacked (x16) layout and its role in the KV cache. Code outside the table asks it rather
// than switching over DType; adding a type is one row (src/tensor/quants.cpp, kTypeTraits)
// plus its kernels. The per-ISA dot products are the other per-type table: IsaKernels
// (tensor/kernels_impl.h), indexed by the same ggml id. docs/kernels.md, "Type traits".
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "tensor/dtype.h"

namespace step35 {

namespace iq {
struct BlockInts;
}

namespace kernels {
// Internal activation formats (not GGUF types; never written to files). Row layouts are
// private to the kernels; only act_row_bytes() (tensor/kernels.h) is needed to size buffers.
enum class ActType : uint8_t { F32, F16, BF16, Q8_0, Q8_1, Q8_K };
}  // namespace kernels

enum class TypeFamily : uint8_t {
  Float,    // one element per block: F32, F16, BF16
  Block32,  // 32-element blocks: Q4_0..Q8_0, MXFP4, IQ4_NL
  KQuant,   // 256-element K-quant super-blocks: Q2_K..Q6_K
  IQ,       // 256-element IQ super-blocks, read through their integer decoders
  TQ,       // 256-element ternary super-blocks, read through their integer decoders
};

// How a type serves as a KV cache type (tensor/kv_kernels.h): not at all, as float keys
// stored dimension-major, or as 32-blocks of integers under F16 scales.
enum class KvRole : uint8_t { None, Float, Int };

using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
using DotRowFn = float (*)(const void* w, const float* x, int64_t n);
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);
using IqDecodeFn = void (*)(const uint8_t* block, iq::BlockInts* out);

struct TypeTraits : DTypeInfo {  // type, name, block_elems, block_bytes
  TypeFamily family;
  // The activation format of the Precision::Native dot product (ggml-cpu's vec_dot_type).
  kernels::ActType act;
  // Reference row kernels (tensor/quants.h): n a multiple of block_elems, not checked here.
  DequantizeRowFn dequantize;
  DotRowFn dot;
  QuantizeRowFn quantize;       // the reference encoder (llama-quantize's bytes), or null
  QuantizeRowFn quantize_fast;  // the same bytes, faster (quantize_row_fast), or null: use quantize
  // For rows whose length is not a multiple of block_elems, the type of a smaller block the
  // quantizer writes instead (K-quant -> the 32-block type of similar size); itself if none.
  DType short_row_type;
  // IQ / TQ: the decoder of one super-block into integer form (tensor/quants_iq.h), and the
  // factor ggml applies to a finished row sum (IQ2_*: 1/8, IQ3_XXS: 1/4; else 1).
  IqDecodeFn iq_decode;
  float dot_row_factor;
  // The repacked 16-row layout (tensor/repack.h): bytes per 256-weight block of a group (0:
  // the type is not repacked), whether a group ends with the rows' F16 scales (32 bytes per
  // block, padded to 64), and the IQ / TQ types' table of signed values per 4-bit code.
  size_t x16_block_bytes;
  bool x16_d_part;
  const int8_t* x16_values;
  KvRole kv;
};

// The row of t; throws std::invalid_argument for a value outside the enum.
const TypeTraits& type_traits(DType t);
// The row of a ggml id, nullptr for ids this engine does not support.
const TypeTraits* type_traits(uint32_t ggml_type_id);
// Every row, in id order.
std::span<const TypeTraits> all_type_traits();

}  // namespace step35
