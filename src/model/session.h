// One sequence run through the model: its KV cache, scratch memory and precision. The
// CLI commands, benchmarks and tests use it; the server's engine batches many sequences
// with Model::forward directly.
#pragma once

#include <memory>
#include <vector>

#include "model/step35.h"
#include "model/workspace.h"

namespace step35 {

class Session {
 public:
  // n_ctx: longest sequence; max_batch: most tokens per forward pass (longer inputs run
  // in chunks); keep_back: positions the cache must be able to roll back (speculation);
  // kv_types: the cache types of keys and values.
  Session(const Model& model, int32_t n_ctx, int32_t max_batch, Precision precision = Precision::Native,
          bool with_mtp = false, int32_t keep_back = 0, KvTypes kv_types = {});

  // Runs n tokens at positions n_pos() ... and appends their K/V. Writes the logits of
  // every position (n × n_vocab) when all_logits, else of the last one. `hidden` gets the
  // last trunk layer's output before output_norm (n × n_embd). Throws std::length_error
  // when the context would overflow (nothing is written then).
  // `embeddings` (optional): n rows of n_embd floats, taken at the tokens of id -1 (images).
  void forward(const int32_t* tokens, int32_t n, bool all_logits, std::vector<float>& logits, ThreadPool& pool,
               std::vector<float>* hidden = nullptr, const DumpFn& dump = nullptr, const float* embeddings = nullptr);

  const Model& model() const { return model_; }
  KvCache& cache() { return cache_; }
  const KvCache& cache() const { return cache_; }
  int32_t n_pos() const { return cache_.n_pos(); }
  int32_t n_ctx() const { return cache_.n_ctx(); }
  Precision precision() const { return ws_.precision; }
  void set_precision(Precision p) { ws_.precision = p; }
  // Expert selection for the following forward calls (default: the model's top-k; see
  // RoutingPolicy for the lossy adaptive policy).
  void set_routing(RoutingPolicy r) { routing_ = r; }
  // MoE statistics of the last forward call.
  const RoutingStats& routing() const { return out_.routing; }
  Workspace* workspace() { return &ws_; }

 private:
  const Model& model_;
  KvCache cache_;
  Workspace ws_;
  BatchOutput out_;
  std::vector<SeqChunk> chunks_;
  RoutingPolicy routing_;
};

}  // namespace step35
