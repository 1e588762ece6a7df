// The expert-parallelism options shared by run, eval and bench (--ep, --ep-placement,
// --record-experts) and what they do around a command's model. Usage in a command:
//   EpSetup ep(parser);                               // starts MPI with --ep
//   if (ep.is_follower()) return ep.follow(path, n_threads);
//   auto model = load_model(path);
//   ep.attach(*model);                                // before the first forward pass
// Only rank 0 gets past follow(), so only rank 0 prints or writes anything.
#pragma once

#include <memory>
#include <string>

#include "args.h"
#include "model/step35.h"
#include "parallel/expert_parallel.h"

namespace step35::cli {

void add_ep_flags(ArgParser& p);

class EpSetup {
 public:
  // Throws UsageError (exit status 2) for --ep in a build without MPI, or the other
  // options without what they need.
  explicit EpSetup(const ArgParser& p);
  // Writes the --record-experts file (rank 0); shuts the followers down.
  ~EpSetup();
  EpSetup(const EpSetup&) = delete;
  EpSetup& operator=(const EpSetup&) = delete;

  bool is_follower() const { return mpi_ && mpi_->rank() > 0; }
  int n_ranks() const { return mpi_ ? mpi_->n_ranks() : 1; }
  // Ranks > 0: load the model quietly and compute experts for rank 0 until it is done.
  // `mem_budget`: this rank's --mem-budget (its expert cache; it holds no KV cache).
  int follow(const std::string& model_path, int n_threads, const std::string& mtp_model = "", uint64_t mem_budget = 0);
  // Rank 0 (or no --ep): install the executor and the expert-count recorder on `model`,
  // which must not be used for forward passes after this object is destroyed (declare
  // the EpSetup before the model).
  void attach(Model& model);

 private:
  class Recorder;
  std::unique_ptr<ExpertParallel> mpi_;
  std::unique_ptr<ExpertExecutor> executor_;
  std::unique_ptr<Recorder> recorder_;
  std::string placement_path_, record_path_;
};

}  // namespace step35::cli
