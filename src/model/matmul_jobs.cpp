// Execution helpers of the forward pass: activation conversion on demand and fused groups
// of matrix products split into dynamically scheduled row chunks.
#include <algorithm>

#include "model/workspace.h"
#include "exec/thread_pool.h"

namespace step35 {

void ActCache::reset(const float* src, int64_t n_rows, int64_t n, int64_t ld) {
  src_ = src;
  n_rows_ = n_rows;
  n_ = n;
  ld_ = ld;
  for (bool& h : have_) h = false;
}

kernels::ActRows ActCache::get(kernels::ActType t, ThreadPool& pool) {
  const int i = int(t);
  const size_t stride = kernels::act_row_bytes(t, n_);
  uint8_t* dst = buf_[i].get(stride * size_t(n_rows_));
  if (!have_[i]) {
    // A decode step converts one row: not worth waking the other threads.
    if (n_rows_ < 8 || pool.n_threads() == 1) {
      kernels::convert_activations(t, src_, n_rows_, n_, ld_, dst);
    } else {
      pool.parallel_for(n_rows_, [&](int64_t r0, int64_t r1, int) {
        kernels::convert_activations(t, src_ + r0 * ld_, r1 - r0, n_, ld_, dst + size_t(r0) * stride);
      });
    }
    have_[i] = true;
  }
  kernels::ActRows rows;
  rows.type = t;
  rows.data = dst;
  rows.stride = stride;
  rows.n_tok = n_rows_;
  return rows;
}

namespace {

struct Chunk {
  int32_t job;
  int64_t row_begin, row_end;
};

}  // namespace

void run_matmuls(std::vector<MatJob>& jobs, ThreadPool& pool) {
  if (jobs.empty()) return;
  // Chunk size: about 256 KiB of weights per chunk for a single token, fewer rows as the
  // token count grows (each row then costs more), aligned to the kernel's tile height.
  // With the tile kernels a 32 KiB chunk takes ~1 µs, so per-chunk costs and the ragged
  // end of each section showed at 2 threads (decode 212 -> 284 t/s going from 32 to
  // 128 KiB). Chunks are consecutive row ranges, and each thread runs its own contiguous
  // share of them (ThreadPool::parallel_stealing), so its weight reads stay sequential:
  // 292 -> 330 t/s at 2 threads against one shared counter, whose interleaving made every
  // chunk start cold. With the repacked x16 kernels 256 KiB is ahead again: on the
  // benchmark model at 2 threads, paired against 128 KiB, tg128 median 1.05 (12 of 16
  // pairs), 8 sequences 1.13, pp512 1.04; 512 KiB was level with 256 KiB. Smaller chunks
  // only at the end of each share (to shorten the wait for the last one) measured 0.95.
  constexpr double kChunkBytes = 262144.0;
  // Per calling thread; the workers see it through the reference below (a thread_local
  // named inside the lambda would be each worker's own, empty, instance).
  thread_local std::vector<Chunk> chunk_storage;
  std::vector<Chunk>& chunks = chunk_storage;
  chunks.clear();
  const int n_threads = pool.n_threads();
  for (size_t j = 0; j < jobs.size(); ++j) {
    const MatJob& job = jobs[j];
    if (job.x.n_tok == 0 || job.w.n_out == 0) continue;
    const int64_t gran = std::max<int64_t>(1, kernels::row_granularity(job.w));
    const double row_cost = double(job.w.row_bytes) * double(1 + job.x.n_tok / 4);
    int64_t rows = int64_t(kChunkBytes / std::max(row_cost, 1.0));
    if (n_threads == 1) rows = job.w.n_out;  // no one to balance with
    rows = std::max(gran, rows / gran * gran);
    for (int64_t r = 0; r < job.w.n_out; r += rows)
      chunks.push_back({int32_t(j), r, std::min(job.w.n_out, r + rows)});
  }
  if (chunks.empty()) return;
  auto run_chunk = [&](int64_t c, int) {
    const Chunk& ch = chunks[size_t(c)];
    const MatJob& job = jobs[size_t(ch.job)];
    kernels::matmul(job.w, ch.row_begin, ch.row_end, job.x, job.y, job.ldy);
  };
  if (n_threads == 1 || chunks.size() == 1)
    for (int64_t c = 0; c < int64_t(chunks.size()); ++c) run_chunk(c, 0);
  else
    pool.parallel_stealing(int64_t(chunks.size()), run_chunk);
}

}  // namespace step35
