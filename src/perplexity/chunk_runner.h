// Runs the model over one chunk of n_ctx text tokens at a time, as llama-perplexity does:
// an empty KV cache per chunk, the chunk's first token replaced by BOS when the vocabulary
// adds BOS, and logits kept only for the second half (positions n_ctx/2 ... n_ctx-1), the
// positions whose next token is scored. Memory: the session's KV cache for n_ctx tokens and
// (n_ctx - n_ctx/2) × n_vocab floats of logits.
#pragma once

#include <cstdint>
#include <vector>

#include "model/session.h"

namespace step35::perplexity {

class ChunkRunner {
 public:
  // max_batch: most tokens per forward pass; kv_types: the KV cache types (llama-perplexity's
  // -ctk / -ctv).
  ChunkRunner(const Model& model, int32_t n_ctx, int32_t max_batch, Precision precision, KvTypes kv_types);

  int32_t n_ctx() const { return n_ctx_; }
  int32_t n_vocab() const { return model_.hparams().n_vocab; }
  int32_t first_scored() const { return n_ctx_ / 2; }
  // Scored rows per chunk: positions first_scored() ... n_ctx-2 (the last position has no
  // next token in the chunk).
  int32_t rows_per_chunk() const { return n_ctx_ - 1 - n_ctx_ / 2; }

  // Runs tokens[0 .. n_ctx) (tokens of the text, not modified) and returns the logits of
  // positions first_scored() ... n_ctx-1, one row of n_vocab per position; valid until the
  // next call.
  const std::vector<float>& run(const int32_t* tokens, ThreadPool& pool);

 private:
  const Model& model_;
  int32_t n_ctx_;
  Session session_;
  std::vector<int32_t> input_;
  std::vector<float> logits_, unused_;
};

}  // namespace step35::perplexity
