// The two measurements of `step35 perplexity`, chunk by chunk over a ChunkRunner:
// perplexity of a text (optionally saving every scored row as a KL-divergence base), and
// KL divergence of this model against a saved base. Rows are scored on the thread pool
// and summed in position order, so results do not depend on the thread count.
#pragma once

#include <functional>
#include <vector>

#include "perplexity/base_file.h"
#include "perplexity/chunk_runner.h"
#include "perplexity/statistics.h"

namespace step35::perplexity {

// Perplexity over chunks 0 .. n_chunk-1 of `tokens` (chunk i = tokens[i·n_ctx, (i+1)·n_ctx)).
// With `base`, each chunk's rows are also written there (and the token nll is the float
// one of llama.cpp's base-writing path). after_chunk(i, sums) runs after chunk i.
PerplexitySums measure_perplexity(ChunkRunner& runner, ThreadPool& pool, const std::vector<int32_t>& tokens,
                                  int32_t n_chunk, BaseFileWriter* base,
                                  const std::function<void(int32_t, const PerplexitySums&)>& after_chunk);

// KL divergence against `base` over its first n_chunk chunks (its tokens are the text).
struct KlMeasurement {
  KlSums sums;
  std::vector<float> kld;     // per scored position, in order
  std::vector<float> p_diff;  // per scored position, in order
};
KlMeasurement measure_kl_divergence(ChunkRunner& runner, ThreadPool& pool, BaseFileReader& base, int32_t n_chunk,
                                    const std::function<void(int32_t, const KlSums&)>& after_chunk);

}  // namespace step35::perplexity
