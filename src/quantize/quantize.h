// `step35 quantize`: the per-tensor type recipe (which type llama-quantize gives each
// tensor of a step35 model for a target file type) and the file conversion that applies
// it. The recipe is in quantize.cpp, the conversion in quantize_file.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"

namespace step35 {

namespace gguf {
class File;
}

// llama.cpp's file types (the value written to general.file_type) that step35 can produce.
// The K mixes (_S/_M/_L) differ only in which tensors get more bits. IQ4_NL / IQ4_XS are
// the IQ file types llama-quantize writes without an importance matrix.
enum class FileType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q8_0 = 7,
  Q5_0 = 8,
  Q5_1 = 9,
  Q2_K = 10,
  Q3_K_S = 11,
  Q3_K_M = 12,
  Q3_K_L = 13,
  Q4_K_S = 14,
  Q4_K_M = 15,
  Q5_K_S = 16,
  Q5_K_M = 17,
  Q6_K = 18,
  IQ4_NL = 25,
  IQ4_XS = 30,
  BF16 = 32,
};

// A TYPE argument as llama-quantize spells it, case-insensitive ("q4_k_m", "Q8_0"); "Q3_K",
// "Q4_K" and "Q5_K" are llama-quantize's aliases of the _M mixes.
std::optional<FileType> file_type_from_name(std::string_view name);
const char* file_type_name(FileType t);  // "Q4_K_M"
std::string file_type_names();           // every accepted name, for help and errors
// The type most tensors get (Q4_K for Q4_K_M ...).
DType file_type_base(FileType t);

// What the recipe needs to know about the model besides tensor names and shapes.
struct QuantizeModelInfo {
  int n_layer_all = 0;  // block_count: trunk layers + MTP blocks
  int n_expert = 0;     // expert_count, 0 for a dense model
  int n_gqa = 0;        // layer 0's query heads / KV heads (0 when it has no KV heads)
};
// Reads those from a step35 GGUF; throws gguf::Error for another architecture or missing keys.
QuantizeModelInfo quantize_model_info(const gguf::File& f);

struct TensorDesc {
  std::string name;
  DType type = DType::F32;       // type in the input file
  int64_t ne[4] = {1, 1, 1, 1};  // shape, ne[0] = row length
};

struct TensorChoice {
  DType type = DType::F32;  // type in the output file (== input type: copied unchanged)
  bool fallback = false;    // the recipe's type did not fit the row length: a smaller block was used
  std::string note;         // for fallbacks: "ncols 128 not divisible by 256 (q4_K) -> q5_0"
};

// The recipe: one choice per tensor, in the order given. Throws std::runtime_error where
// llama-quantize refuses (a layer-indexed tensor without a valid blk.N prefix).
std::vector<TensorChoice> choose_tensor_types(const std::vector<TensorDesc>& tensors, const QuantizeModelInfo& info,
                                              FileType ft);

// ---- file conversion ---------------------------------------------------------------------

struct QuantizeOptions {
  FileType type = FileType::Q8_0;
  int n_threads = 1;
  // One line per event (tensor progress, warnings); nullptr = silent.
  std::function<void(const std::string& line)> log;
};

struct QuantizeSummary {
  struct PerType {
    size_t tensors = 0;
    uint64_t bytes = 0;
    uint64_t elements = 0;
  };
  std::map<std::string, PerType> by_type;  // output type name -> totals
  size_t n_tensors = 0;
  size_t n_quantized = 0;    // tensors converted (the rest copied unchanged)
  size_t n_fallback = 0;     // tensors whose recipe type did not fit their rows
  size_t n_requantized = 0;  // converted tensors whose input was already quantized
  uint64_t n_elements = 0;
  uint64_t input_bytes = 0;   // tensor data only
  uint64_t output_bytes = 0;  // tensor data only
  uint64_t output_file_bytes = 0;
  double seconds = 0;
};

// Converts the GGUF at in_path (the first part of a split model) to opts.type and writes
// one file at out_path: all metadata copied except split.*, general.file_type and
// general.quantization_version set as llama-quantize sets them, tensors in the input's
// order and alignment. Tensors are converted a slab of rows at a time, so memory stays
// bounded whatever the model size. Throws gguf::Error / std::runtime_error with a clear
// message (out_path is removed when a write fails or input data is not finite).
QuantizeSummary quantize_gguf(const std::string& in_path, const std::string& out_path, const QuantizeOptions& opts);

}  // namespace step35
