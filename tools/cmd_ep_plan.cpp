// step35 ep-plan: a balanced expert placement for expert parallelism from the expert
// activation counts a run recorded (--record-experts), with the per-rank load imbalance of
// the contiguous default and of the plan.
#include <algorithm>
#include <cstdio>

#include "args.h"
#include "commands.h"
#include "parallel/expert_placement.h"

namespace step35::cli {

static int ep_plan_main(const Args& args) {
  ArgParser p("ep-plan",
              "Reads expert activation counts (step35 run|eval|bench --record-experts FILE) and writes a placement "
              "for --ep-placement that spreads the most-used experts over the ranks (each rank keeps an equal "
              "share of experts). Prints, per MoE block, the load imbalance (busiest rank's (token, expert) pairs "
              "over the mean) of the contiguous default and of the plan.");
  std::string counts_path, output;
  int32_t R = 1;
  p.option("--counts", "FILE", "expert counts JSON from --record-experts", counts_path);
  p.option("-n,--ranks", "R", "number of ranks the placement is for (mpirun -np R)", R, 1, 1 << 16, "required");
  p.option("-o,--output", "FILE", "placement JSON to write", output);
  if (!p.parse(args)) return 0;
  if (!p.has("counts")) throw UsageError("--counts FILE is required");
  if (!p.has("ranks")) throw UsageError("-n R is required");
  if (!p.has("output")) throw UsageError("-o FILE is required");
  const ExpertCounts counts = ExpertCounts::from_json(read_text_file(counts_path));
  if (counts.layers.empty()) throw UsageError(counts_path + " records no MoE blocks");
  if (R > counts.n_expert)
    throw UsageError("more ranks (" + std::to_string(R) + ") than experts (" + std::to_string(counts.n_expert) + ")");
  const ExpertPlacement plan = plan_placement(counts, R);
  const ExpertPlacement contiguous(R, counts.n_expert);

  std::printf("%-6s %14s %14s\n", "block", "contiguous", "planned");
  double sum_before = 0, sum_after = 0, worst_before = 0, worst_after = 0;
  for (const auto& [il, c] : counts.layers) {
    const double before = imbalance(rank_loads(contiguous, il, c));
    const double after = imbalance(rank_loads(plan, il, c));
    std::printf("%-6d %14.3f %14.3f\n", il, before, after);
    sum_before += before;
    sum_after += after;
    worst_before = std::max(worst_before, before);
    worst_after = std::max(worst_after, after);
  }
  const double n = double(counts.layers.size());
  std::printf("mean   %14.3f %14.3f\nworst  %14.3f %14.3f\n", sum_before / n, sum_after / n, worst_before,
              worst_after);
  std::printf("imbalance = busiest rank's load / mean rank load (1.000 = balanced), %d ranks, %zu MoE blocks\n", R,
              counts.layers.size());
  write_text_file(output, plan.to_json());
  std::fprintf(stderr, "wrote %s\n", output.c_str());
  return 0;
}

int cmd_ep_plan(const Args& args) { return run_guarded("ep-plan", ep_plan_main, args); }

}  // namespace step35::cli
