// Random-weight step35 models with the real model's proportions, written with the
// project's own GGUF writer. Used by `step35 make-tiny`, by `step35 run` without -m
// (the built-in tiny model) and by tests and benchmarks.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/dtype.h"

namespace step35 {

struct TinyModelOptions {
  std::string preset = "tiny";  // "tiny" (default, 14M params, ~57 MB in F32) | "bench" (peer.md shape)
  uint64_t seed = 1;
  DType weight_type = DType::F32;  // f32 | f16 | bf16 | q8_0 for matrices; norms/router stay F32
  std::string name;                // general.name; default derived from the output file name
  // Router bias that makes a few experts hot, as trained routers do (0: the near-even
  // spread of random routers). Each MoE block ranks its experts in a seeded random order
  // and biases the expert of rank r by -hot_experts * ln(1 + r).
  double hot_experts = 0;
};

// What was written (for `step35 make-tiny`'s JSON summary).
struct TinyModelSummary {
  uint64_t bytes = 0;     // file size
  uint64_t params = 0;    // elements over all tensors
  int32_t n_layer = 0;    // trunk layers
  int32_t n_mtp = 0;      // MTP blocks (block_count = n_layer + n_mtp)
  int32_t n_vocab = 0;
  int32_t n_merges = 0;
  int32_t n_tensors = 0;
};

// Writes the model to `path`. Throws std::invalid_argument for an unknown preset or an
// unsupported weight type, std::runtime_error (or gguf::Error) on I/O failure. The same
// options give a byte-identical file. Fills *summary when given.
void make_tiny_model(const TinyModelOptions& options, const std::string& path,
                     TinyModelSummary* summary = nullptr);

}  // namespace step35
