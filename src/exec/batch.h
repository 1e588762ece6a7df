// One forward pass over several sequences at once: each sequence contributes a run of
// consecutive tokens (a prompt chunk, one decode token, or a token plus speculative
// drafts) that continues its KV cache.
#pragma once

#include <cstdint>
#include <vector>

#include "exec/kv_cache.h"

namespace step35 {

// Which positions of a chunk need logits.
enum class LogitRows : uint8_t { None, Last, All };

// How a sequence's tokens are routed in MoE layers. mass <= 0: strict (the model's
// top-k). Otherwise adaptive (lossy): per token keep the smallest prefix of the top-k
// experts (by selection score) whose normalised router weights sum to >= mass, never
// fewer than min_k, and renormalise the kept weights.
struct RoutingPolicy {
  float adaptive_mass = 0.0f;
  int32_t adaptive_min_k = 0;
};

struct SeqChunk {
  KvSeq* seq = nullptr;           // positions seq->n_pos ... are written
  const int32_t* tokens = nullptr;
  int32_t n_tokens = 0;
  // Input rows in place of token embeddings (an image's positions): a token id of -1 takes
  // row i of these n_tokens rows of n_embd floats. Null: every token is a vocabulary id.
  const float* embeddings = nullptr;
  LogitRows logits = LogitRows::Last;
  bool want_hidden = false;       // the last trunk layer's output of every token (MTP input)
  RoutingPolicy routing;
  // Position of KV slot 0 of `seq` (an MTP block's cache may start mid-sequence): token i
  // sits at position seq->n_pos + pos_offset + i, which is what RoPE sees.
  int32_t pos_offset = 0;
};

// MoE statistics of one forward pass (summed over MoE layers; the engine averages).
struct RoutingStats {
  int64_t n_moe_layers = 0;
  int64_t token_layer_pairs = 0;      // tokens x MoE layers
  double entropy_sum = 0;             // Σ entropy (nats) of the normalised selected weights
  int64_t distinct_experts_sum = 0;   // Σ over layers of distinct experts used by the batch
  int64_t adaptive_tokens = 0;        // token x layer routings under an adaptive policy
  int64_t adaptive_experts = 0;       // experts they kept
  int32_t n_expert = 0;
  std::vector<int32_t> expert_counts; // [MoE layer][expert] activations in this pass
  void clear() {
    std::vector<int32_t> keep;
    keep.swap(expert_counts);
    *this = RoutingStats{};
    keep.clear();
    expert_counts.swap(keep);
  }
};

// Results of one forward pass. Logit rows come in chunk order, within a chunk in position
// order (one row for Last, n_tokens rows for All). Hidden rows likewise for chunks that
// asked for them.
struct BatchOutput {
  std::vector<float> logits;
  std::vector<int32_t> logits_offset;  // per chunk: first logit row (or -1)
  std::vector<float> hidden;
  std::vector<int32_t> hidden_offset;  // per chunk: first hidden row (or -1)
  RoutingStats routing;
};

}  // namespace step35
