// Helpers shared by the CLI subcommands.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "args.h"
#include "model/step35.h"

namespace step35::cli {

// Default thread count: the machine's cores.
int default_threads();
// Loads a model with a summary on stderr (and a progress bar when stderr is a terminal).
std::unique_ptr<Model> load_model(const std::string& path, bool quiet = false);
// Prints the KV cache size and layout to stderr.
void print_kv_cache(const KvCache& cache);
// The built-in tiny random model: created on first use in the cache folder
// ($STEP35_CACHE_DIR, else $XDG_CACHE_HOME/step35, else ~/.cache/step35).
std::string builtin_tiny_model_path();
// Parses "1,2,3" into token ids (UsageError on anything else).
std::vector<int32_t> parse_token_list(const std::string& s);
double now_seconds();
// --mtp K|auto: drafts per step at most and whether K adapts per step.
struct MtpSetting {
  int32_t max_k = 0;
  bool adaptive = false;
};
// The value's syntax only (for commands that load the model later, like serve).
MtpSetting parse_mtp_value(const std::string& value);
// The value checked against the model: a fixed K needs MTP blocks; auto without them is 0.
MtpSetting parse_mtp(const std::string& value, const Model& model);

// --patch FILE (repeatable) of run, eval and serve: patch files applied to the model.
void add_patch_flag(ArgParser& p);
// Reads, checks and installs the --patch files (UsageError naming the file on a mismatch).
void apply_patch_flags(Model& model, const ArgParser& p);

// --expert-policy strict|adaptive (each command declares that flag with its own help) and
// the adaptive policy's --adaptive-mass X / --adaptive-min-k N (declared here).
struct ExpertPolicySetting {
  bool adaptive = false;
  float mass = 0.9f;
  int32_t min_k = 4;
};
void add_adaptive_policy_flags(ArgParser& p);
ExpertPolicySetting parse_expert_policy(const ArgParser& p);

}  // namespace step35::cli
