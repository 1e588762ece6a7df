// ggml tensor element types: ids as stored in GGUF, block geometry, names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace step35 {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct DTypeInfo {
  DType type;
  const char* name;     // lower case, as llama.cpp prints it: "f32", "q4_K", ...
  int64_t block_elems;  // elements per block (1 for float types)
  size_t block_bytes;   // bytes per block
};

// nullptr for ids this engine does not support.
const DTypeInfo* dtype_info(uint32_t ggml_type_id);
const DTypeInfo& dtype_info(DType t);
inline const char* dtype_name(DType t) { return dtype_info(t).name; }
// Every supported type's name, in id order, comma-separated (for error messages).
std::string dtype_names();
// Case-insensitive lookup by name ("q4_k", "Q8_0", "bf16" ...).
std::optional<DType> dtype_from_name(std::string_view name);
// Bytes for one row of n elements; nullopt if n is not a multiple of the block size.
std::optional<size_t> row_bytes(DType t, int64_t n);

}  // namespace step35
