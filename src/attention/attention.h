// Streaming (flash-style) attention over the paged, typed KV cache (exec/kv_cache.h).
//
// For every query row softmax(q·K / sqrt(d)) V runs as an online softmax over the cache
// blocks the row may see (causal, and the window on sliding-window layers), one block at a
// time: no row of scores longer than a block ever exists, whatever the context. Work is
// split across threads by (tile of consecutive tokens of one sequence, KV head, span of
// kSpanBlocks blocks); the query heads that share a KV head go through each block together.
//
// Results do not depend on the thread count, on the other tokens of a batch, or on how the
// work is split, bit for bit: a row's positions are cut into spans at fixed multiples of the
// span length, each span's partial result (running max, sum, weighted values) starts from
// nothing, and the partials are merged in position order by one left fold, whether one job
// walks all the spans (long batches: enough jobs already) or each span is a job of its own
// and the fold runs after them (a decoded token deep in a long context: the spans keep every
// thread busy; the job that finishes a row group's last span folds its partials).
//
// Quantized caches follow llama.cpp: with Q8_0 / Q4_0 keys (values), queries and keys
// (values and the attention output) go through the Walsh-Hadamard rotation of
// tensor/kv_kernels.h when the head dimension is a multiple of 64 (chunks of the largest
// power of two >= 64 dividing it for keys, 64 for values).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "exec/batch.h"
#include "exec/kv_cache.h"

namespace step35 {

class ThreadPool;

// One layer's attention geometry. Query head h uses KV head h / (n_head / n_head_kv).
struct AttentionLayer {
  size_t kv_layer = 0;  // the layer's index in the KV pool
  int32_t n_head = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
  bool is_swa = false;
  int32_t window = 0;  // SWA layers: a query sees itself and the window - 1 positions before
};

// The chunk sizes of the Hadamard rotation llama.cpp applies around a cache of these types
// (0: none).
struct KvRotation {
  int32_t k = 0;
  int32_t v = 0;
};
KvRotation kv_rotation(KvTypes types, int32_t head_dim_k, int32_t head_dim_v);

// The tokens of a forward pass: token t continues chunks[chunk_of[t]].seq at KV slot slot[t].
// The tokens of one chunk are consecutive, at consecutive slots.
struct AttentionBatch {
  const std::vector<SeqChunk>* chunks = nullptr;
  int64_t n_tokens = 0;
  const int32_t* slot = nullptr;
  const int32_t* chunk_of = nullptr;
};

// Scratch memory reused across calls (grows to the largest batch seen).
struct AttentionScratch {
  std::vector<uint8_t> queries;  // converted query rows
  std::vector<float> partials;   // per-span partial results of split jobs
  struct Job {
    int64_t tile, g, span;  // span < 0: all spans of the tile
  };
  std::vector<Job> jobs;
  struct Tile {
    int64_t t0, n;         // first token and token count
    int32_t first, last;   // lowest and highest slot any of its rows sees
    int64_t span0, spans;  // its spans
    int64_t partial0;      // index of its first partial (split jobs)
  };
  std::vector<Tile> tiles;
  // Split jobs: per (tile, KV head) the spans not finished yet; the job that finishes the
  // last one folds them.
  std::unique_ptr<std::atomic<int64_t>[]> spans_left;
  size_t spans_left_size = 0;
};

// Positions per span (in cache blocks): the unit of the thread split and of the fold.
constexpr int32_t kSpanBlocks = 8;
// Tokens of one sequence that go through the cache blocks together.
constexpr int64_t kTileTokens = 8;

// Writes the keys k[t][n_head_kv][head_dim_k] and values v[t][n_head_kv][head_dim_v] of every
// token into the cache at its slot (rotating k and v in place first where the types say so).
// The sequences' blocks must be reserved.
void store_kv(KvPool& kv, const AttentionLayer& layer, const AttentionBatch& batch, float* k, float* v,
              ThreadPool& pool);

// o[t][n_head][head_dim_v] = attention of q[t][n_head][head_dim_k] (after RoPE; not changed)
// over the cache, which must already hold every token's own key and value.
void attend(const KvPool& kv, const AttentionLayer& layer, const AttentionBatch& batch, const float* q, float* o,
            ThreadPool& pool, AttentionScratch& scratch);

// The same computed the plain way (one query row at a time, blocks in order, no spans, no
// threads), with the scalar kernels' formulas: the reference the tests compare attend()
// with. Slow.
void attend_reference(const KvPool& kv, const AttentionLayer& layer, const AttentionBatch& batch, const float* q,
                      float* o);

}  // namespace step35
