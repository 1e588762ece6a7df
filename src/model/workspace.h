// Scratch memory and execution helpers of the forward pass. A Workspace is grown to the
// largest batch it has seen and then reused, so a decode step allocates nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/attention.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

namespace step35 {

class ThreadPool;

// A buffer that only grows (resize() never shrinks or re-initialises kept elements).
template <typename T>
struct Scratch {
  std::vector<T> v;
  T* get(size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
};

// F32 rows converted, on first request, to each activation format a weight type needs.
class ActCache {
 public:
  // Forgets earlier conversions; rows of `src` (n_rows x n, stride ld) are the source.
  void reset(const float* src, int64_t n_rows, int64_t n, int64_t ld);
  // Rows in format t (converting them on the first call for t), for all rows.
  kernels::ActRows get(kernels::ActType t, ThreadPool& pool);

 private:
  const float* src_ = nullptr;
  int64_t n_rows_ = 0, n_ = 0, ld_ = 0;
  bool have_[6] = {};
  Scratch<uint8_t> buf_[6];
};

// One matrix product of a fused group: y[t*ldy + o] = W[o] · x_t.
struct MatJob {
  WeightMatrix w;                   // one 2-D matrix (experts: WeightMatrix::matrix(e))
  kernels::ActRows x;
  float* y = nullptr;
  int64_t ldy = 0;
};

// Runs a group of independent matrix products together: their rows are cut into chunks
// that the threads take dynamically, so one barrier covers the whole group.
void run_matmuls(std::vector<MatJob>& jobs, ThreadPool& pool);

struct Workspace {
  Precision precision = Precision::Native;
  Scratch<float> x, a, tmp, q, k, v, gate, o, router, next_router, gu, down, shared_gu, shared_out, logits_in;
  Scratch<float> moe_weights, moe_weights_raw;
  Scratch<int32_t> moe_topk, moe_topk_n;  // selected experts per token (and how many kept)
  Scratch<int32_t> pos, slot, seq_of;     // per token: position, KV slot, chunk index
  std::vector<std::vector<int32_t>> expert_tokens;  // per expert: batch token indices
  std::vector<std::vector<int32_t>> expert_slots;   // per expert: (token*K + slot)
  std::vector<int32_t> routed_experts;              // experts with tokens (first-use repacking)
  std::vector<int32_t> predicted_experts;           // the next block's, to read ahead (memory budget)
  Scratch<int32_t> slot_row;              // (token*K + slot) -> row in gu/down
  Scratch<int64_t> expert_first_row;      // per expert: its first row in gu/down
  Scratch<uint8_t> row_local;             // expert parallelism: row computed in this process
  Scratch<uint8_t> row_act_type;          // per routed row: its down activation format (replaced experts)
  std::vector<std::vector<int32_t>> remote_tokens;  // expert_tokens without experts kept local
  Scratch<uint8_t> down_act, shared_act;
  ActCache acts;                          // of the current normed input (attention or FFN)
  ActCache o_acts;
  ActCache final_acts;
  std::vector<MatJob> jobs;
  struct RopeKey {
    int32_t n_rot;
    float base;
    bool freqs;
  };
  std::vector<RopeKey> rope_keys;          // rotary settings tabulated in this pass
  std::vector<Scratch<float>> rope_tables;
  AttentionScratch attention;
};

}  // namespace step35
