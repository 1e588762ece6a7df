#include "ep_options.h"

#include <cstdio>

#include "common.h"
#include "exec/thread_pool.h"

namespace step35::cli {

void add_ep_flags(ArgParser& p) {
  p.flag("--ep", "", "expert parallelism: run under mpirun -np R; rank 0 does everything but the routed experts, "
                     "which each rank computes for its share (docs/distributed.md)");
  p.flag("--ep-placement", "FILE", "with --ep: which rank holds each expert (from step35 ep-plan)",
         "contiguous: expert e on rank e*R/n_expert");
  p.flag("--record-experts", "FILE", "write per-block expert activation counts as JSON at exit (input of step35 ep-plan)");
}

class EpSetup::Recorder final : public ExpertCountObserver {
 public:
  void observe(int il, const int32_t* counts, int64_t n_expert) override { counts_.add(il, counts, n_expert); }
  const ExpertCounts& counts() const { return counts_; }

 private:
  ExpertCounts counts_;
};

EpSetup::EpSetup(const ArgParser& p) : placement_path_(p.str("ep-placement")), record_path_(p.str("record-experts")) {
  if (p.has("ep-placement") && !p.has("ep")) throw UsageError("--ep-placement needs --ep");
  if (!p.has("ep")) return;
  if (!mpi_built()) throw UsageError("--ep: this step35 was built without MPI (install libopenmpi-dev and rebuild)");
  mpi_ = ExpertParallel::start();
}

EpSetup::~EpSetup() {
  // (The model, declared after this object, is gone by now: it is not touched here.)
  if (recorder_ && !record_path_.empty()) {
    try {
      write_text_file(record_path_, recorder_->counts().to_json());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "step35: error: --record-experts: %s\n", e.what());
    }
  }
  // mpi_'s destructor (last) releases the followers and finalises MPI.
}

int EpSetup::follow(const std::string& model_path, int n_threads, const std::string& mtp_model, uint64_t mem_budget) {
  std::unique_ptr<Model> model;
  try {
    model = load_model(model_path, true, mtp_model, {mem_budget, 0, {}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step35 rank %d: error: %s\n", mpi_->rank(), e.what());
    mpi_->abort_all(1);
  }
  ThreadPool pool(n_threads);
  mpi_->follow(*model, pool);
  return 0;
}

void EpSetup::attach(Model& model) {
  if (!record_path_.empty()) {
    recorder_ = std::make_unique<Recorder>();
    model.set_expert_observer(recorder_.get());
  }
  if (!mpi_) return;
  const int32_t X = model.hparams().n_expert;
  if (X < 1) return;  // no MoE blocks: nothing to distribute
  ExpertPlacement placement(mpi_->n_ranks(), X);
  if (!placement_path_.empty()) {
    try {
      placement = ExpertPlacement::from_json(read_text_file(placement_path_));
    } catch (const std::exception& e) {
      throw UsageError("--ep-placement " + placement_path_ + ": " + e.what());
    }
  }
  try {
    executor_ = mpi_->executor(model, std::move(placement));
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--ep-placement: ") + e.what());
  }
  model.set_expert_executor(executor_.get());
  std::fprintf(stderr, "expert parallelism: %d ranks, placement %s\n", mpi_->n_ranks(),
               placement_path_.empty() ? "contiguous" : placement_path_.c_str());
}

}  // namespace step35::cli
