// Lookups of the ggml element types this engine reads (GGUF id, llama.cpp's printed name,
// block geometry) in the type traits table (tensor/type_traits.h; layouts in
// docs/architecture.md, "Weight types and block layouts").
#include "tensor/dtype.h"

#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

#include "tensor/type_traits.h"

namespace step35 {

namespace {

char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; }

}  // namespace

const DTypeInfo* dtype_info(uint32_t ggml_type_id) { return type_traits(ggml_type_id); }

const DTypeInfo& dtype_info(DType t) {
  const DTypeInfo* info = dtype_info(uint32_t(t));
  // A DType value outside the enum can only come from a cast of an unchecked id: a
  // programming error, not bad input (file ids go through the uint32_t overload).
  if (!info) throw std::invalid_argument("unsupported ggml type id " + std::to_string(uint32_t(t)));
  return *info;
}

std::string dtype_names() {
  std::string s;
  for (const auto& t : all_type_traits()) {
    if (!s.empty()) s += ", ";
    s += t.name;
  }
  return s;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& t : all_type_traits()) {
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
