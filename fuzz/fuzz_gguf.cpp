// libFuzzer target: arbitrary bytes as a GGUF file, through the parser, every metadata and
// tensor accessor, the scalar dequantizer of every tensor type (first row of each tensor:
// fuzzed IQ grid indices, scales and signs included), the tokenizer loader and the step35
// model loader (Model::load_buffer).
// Built by CMake with -DSTEP35_FUZZ=ON (see fuzz/run.sh).
//
// Contract checked: malformed input ends in gguf::Error (the loaders' one error type), never
// a crash, an out-of-bounds read (ASan), undefined behaviour (UBSan), another exception or
// a hang. A parsed file's tensors must lie inside the input buffer.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include <vector>

#include "gguf/gguf.h"
#include "model/step35.h"
#include "tensor/dtype.h"
#include "tensor/quants.h"
#include "tokenizer/tokenizer.h"

using namespace step35;

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_gguf: %s: %s\n", what, detail.c_str());
  std::abort();
}

void exercise_file(const gguf::File& f, const uint8_t* data, size_t size) {
  for (const auto& [key, value] : f.metadata()) {
    (void)value.to_string();
    // Every typed getter either answers or throws gguf::Error.
    try { (void)f.get_u64(key); } catch (const gguf::Error&) {}
    try { (void)f.get_f32(key); } catch (const gguf::Error&) {}
    try { (void)f.get_str_array(key); } catch (const gguf::Error&) {}
    try { (void)f.get_i32_array(key); } catch (const gguf::Error&) {}
    try { (void)f.get_u32_per_layer(key, 4); } catch (const gguf::Error&) {}
  }
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (t.data < data || t.nbytes > size || t.data + t.nbytes > data + size)
      fail("tensor outside the buffer", t.name);
    // Touch the first and last byte: ASan reports if they are not ours.
    if (t.nbytes > 0) {
      volatile uint8_t first = t.data[0], last = t.data[t.nbytes - 1];
      (void)first;
      (void)last;
    }
    // Decode the first row: any bytes are a valid block of their type (grid indices cannot
    // leave their grids), so this must neither crash nor read outside the tensor.
    const DTypeInfo* info = dtype_info(t.type);
    const std::optional<size_t> rb = info ? row_bytes(info->type, t.ne[0]) : std::nullopt;
    if (rb && *rb <= t.nbytes && t.ne[0] <= (int64_t(1) << 16)) {
      std::vector<float> row(size_t(t.ne[0]));
      dequantize_row_ref(info->type, t.data, row.data(), t.ne[0]);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<gguf::File> f;
  try {
    f = gguf::File::parse_buffer(data, size, "fuzz.gguf");
  } catch (const gguf::Error&) {
    return 0;
  } catch (const std::exception& e) {
    fail("parse_buffer threw a non-gguf::Error", e.what());
  }
  exercise_file(*f, data, size);

  try {
    std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(*f);
    std::vector<TokenId> ids = tok->encode("Hello, world! <|im_start|> 123 \xff", true, true);
    for (TokenId id : ids)
      if (id < 0 || size_t(id) >= tok->n_vocab()) fail("token id outside the vocabulary", std::to_string(id));
    (void)tok->decode(ids);
  } catch (const gguf::Error&) {
  } catch (const std::exception& e) {
    fail("tokenizer loader threw a non-gguf::Error", e.what());
  }

  try {
    Model::LoadOptions opts;
    opts.verbose = false;
    (void)Model::load_buffer(data, size, "fuzz.gguf", opts);
  } catch (const gguf::Error&) {
  } catch (const std::exception& e) {
    fail("model loader threw a non-gguf::Error", e.what());
  }
  return 0;
}
