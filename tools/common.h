// Helpers shared by the CLI subcommands.
#pragma once

#include <memory>
#include <string>
#include <vector>

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
MtpSetting parse_mtp(const std::string& value, const Model& model);

}  // namespace step35::cli
