// Expert parallelism over MPI (docs/distributed.md). Rank 0 runs the whole program:
// tokenizer, scheduling, attention, dense layers, router, shared expert, head, sampling
// and all output. Per MoE block it sends each other rank the normed activation rows its
// experts were routed (already in the gate/up activation format) and the (expert, row)
// lists; the rank computes those experts with the same kernels and sends the F32 down-
// projection rows back, which rank 0 combines in the single-process order. Ranks > 0
// therefore hold no KV cache and only ever read their own experts' weights.
#pragma once

#include <cstdint>
#include <memory>

#include "model/expert_executor.h"
#include "parallel/expert_placement.h"

namespace step35 {

class Model;
class ThreadPool;

// Whether this build has MPI (STEP35_HAVE_MPI).
bool mpi_built();

class ExpertParallel {
 public:
  // Initialises MPI. Throws std::runtime_error when built without MPI.
  static std::unique_ptr<ExpertParallel> start();
  // Rank 0: tells the followers to exit. Every rank: finalises MPI.
  ~ExpertParallel();
  ExpertParallel(const ExpertParallel&) = delete;
  ExpertParallel& operator=(const ExpertParallel&) = delete;

  int rank() const { return rank_; }
  int n_ranks() const { return n_ranks_; }

  // Rank 0: the executor that computes experts owned by rank 0 here and sends the others.
  // Throws std::invalid_argument if the placement's rank or expert count does not match.
  std::unique_ptr<ExpertExecutor> executor(const Model& model, ExpertPlacement placement);
  // Ranks > 0: serves rank 0's requests until it shuts down. On an error, prints it and
  // aborts the whole job (rank 0 would otherwise wait forever).
  // Replaced experts (model patches) arrive from rank 0 between work messages and apply
  // from the next one on.
  void follow(Model& model, ThreadPool& pool);
  // Aborts every rank (an error on one must not leave the others waiting).
  [[noreturn]] void abort_all(int code);

 private:
  ExpertParallel() = default;
  int rank_ = 0, n_ranks_ = 1;
  bool shut_down_ = false;
};

}  // namespace step35
