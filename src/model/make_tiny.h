// Random-weight step35 models with the real model's proportions, written with the
// project's own GGUF writer. Used by `step35 make-tiny`, by `step35 run` without -m
// (the built-in tiny model) and by tests and benchmarks.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/dtype.h"

namespace step35 {

struct TinyModelOptions {
  std::string preset = "tiny";  // "tiny" (default, ~ a few MB) | "bench" (../shared/docs/peer.md shape)
  uint64_t seed = 1;
  DType weight_type = DType::F32;  // f32 | f16 | bf16 | q8_0 for matrices; norms/router stay F32
  std::string name;                // general.name; default derived from the output file name
};

// Writes the model to `path`. Throws std::runtime_error (or gguf::Error) on failure.
void make_tiny_model(const TinyModelOptions& options, const std::string& path);

}  // namespace step35
