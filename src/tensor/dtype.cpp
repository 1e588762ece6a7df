// Table of the ggml element types this engine reads: GGUF id, llama.cpp's printed name and
// block geometry (docs/architecture.md, "Weight types and block layouts").
#include "tensor/dtype.h"

#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

namespace step35 {

namespace {

// Ordered by id; dtype_info(id) does a linear scan (25 entries — cheaper than a map and
// needs no static initialisation order care). Block bytes of the IQ and TQ types: ggml's
// block_iq*/block_tq* structs (tensor/quants.h reproduces them and checks the sizes).
constexpr DTypeInfo kTypes[] = {
    {DType::F32, "f32", 1, 4},
    {DType::F16, "f16", 1, 2},
    {DType::Q4_0, "q4_0", 32, 18},
    {DType::Q4_1, "q4_1", 32, 20},
    {DType::Q5_0, "q5_0", 32, 22},
    {DType::Q5_1, "q5_1", 32, 24},
    {DType::Q8_0, "q8_0", 32, 34},
    {DType::Q2_K, "q2_K", 256, 84},
    {DType::Q3_K, "q3_K", 256, 110},
    {DType::Q4_K, "q4_K", 256, 144},
    {DType::Q5_K, "q5_K", 256, 176},
    {DType::Q6_K, "q6_K", 256, 210},
    {DType::IQ2_XXS, "iq2_xxs", 256, 66},
    {DType::IQ2_XS, "iq2_xs", 256, 74},
    {DType::IQ3_XXS, "iq3_xxs", 256, 98},
    {DType::IQ1_S, "iq1_s", 256, 50},
    {DType::IQ4_NL, "iq4_nl", 32, 18},
    {DType::IQ3_S, "iq3_s", 256, 110},
    {DType::IQ2_S, "iq2_s", 256, 82},
    {DType::IQ4_XS, "iq4_xs", 256, 136},
    {DType::IQ1_M, "iq1_m", 256, 56},
    {DType::BF16, "bf16", 1, 2},
    {DType::TQ1_0, "tq1_0", 256, 54},
    {DType::TQ2_0, "tq2_0", 256, 66},
    {DType::MXFP4, "mxfp4", 32, 17},
};

char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; }

}  // namespace

const DTypeInfo* dtype_info(uint32_t ggml_type_id) {
  for (const auto& t : kTypes)
    if (uint32_t(t.type) == ggml_type_id) return &t;
  return nullptr;
}

const DTypeInfo& dtype_info(DType t) {
  const DTypeInfo* info = dtype_info(uint32_t(t));
  // A DType value outside the enum can only come from a cast of an unchecked id: a
  // programming error, not bad input (file ids go through the uint32_t overload).
  if (!info) throw std::invalid_argument("unsupported ggml type id " + std::to_string(uint32_t(t)));
  return *info;
}

std::string dtype_names() {
  std::string s;
  for (const auto& t : kTypes) {
    if (!s.empty()) s += ", ";
    s += t.name;
  }
  return s;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& t : kTypes) {
    std::string_view n = t.name;
    if (n.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < n.size() && eq; ++i) eq = ascii_lower(n[i]) == ascii_lower(name[i]);
    if (eq) return t.type;
  }
  return std::nullopt;
}

std::optional<size_t> row_bytes(DType t, int64_t n) {
  const DTypeInfo* info = dtype_info(uint32_t(t));
  if (!info || n < 0 || n % info->block_elems != 0) return std::nullopt;
  // n comes from file headers: refuse sizes that do not fit in size_t rather than wrap.
  const uint64_t blocks = uint64_t(n / info->block_elems);
  if (blocks != 0 && info->block_bytes > std::numeric_limits<size_t>::max() / blocks) return std::nullopt;
  return size_t(blocks) * info->block_bytes;
}

}  // namespace step35
