// Helpers shared by the CLI subcommands.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "args.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/step35.h"
#include "vision/image_prompt.h"

namespace step35::cli {

// Default thread count: the machine's cores.
int default_threads();
// Loads a model with a summary on stderr (and a progress bar when stderr is a terminal);
// `mtp_model` is --mtp-model's value (Model::LoadOptions::mtp_model).
// `memory`: --mem-budget and what the command will keep in its KV cache (docs/memory.md).
struct ModelMemory {
  uint64_t budget = 0;       // bytes; 0: no budget
  int64_t kv_positions = 0;  // positions of all sequences held at once
  KvTypes kv_types;
};
std::unique_ptr<Model> load_model(const std::string& path, bool quiet = false, const std::string& mtp_model = "",
                                  const ModelMemory& memory = {});
// --mem-budget SIZE (run, serve, bench, eval, perplexity): the value as given.
void add_mem_budget_flag(ArgParser& p, std::string& size);
// "200M", "3.5G", "512K", "1T" (powers of 1024; a trailing "iB" or "B" is allowed) or a
// byte count; "" or "0": no budget. UsageError for anything else.
uint64_t parse_mem_size(const std::string& size);
// A file's bytes / writes bytes to a file (UsageError naming the file and the reason).
std::vector<uint8_t> read_file_bytes(const std::string& path);
void write_file_bytes(const std::string& path, const void* data, size_t n);
// --mtp-model FILE|none: the MTP sidecar file (run, eval, serve, bench, inspect).
void add_mtp_model_flag(ArgParser& p, std::string& mtp_model);
// --mmproj and --image (run, eval): the vision tower and the pictures for the prompt's media
// markers.
void add_picture_flags(ArgParser& p, std::string& mmproj, std::vector<std::string>& images);
// The prompt with the pictures of `files` in place of its media markers (one per picture), as
// llama.cpp's libmtmd lays it out, encoded through the tower of `mmproj`; one line on stderr
// says what it took. UsageError for a tower, file or prompt that cannot be used.
vision::ImagePrompt picture_prompt(const Model& model, const std::string& mmproj, const std::vector<std::string>& files,
                                   const std::string& prompt, ThreadPool& pool, bool add_bos);
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

// --patch FILE (repeatable) of run, eval and serve: patch files from step35 finetune.
void add_patch_flag(ArgParser& p, std::vector<std::string>& paths);
// Reads, checks and installs the patch files (UsageError naming the file on a mismatch).
void apply_patches(Model& model, const std::vector<std::string>& paths);

// Flag groups several commands share, each bound to the settings it fills (their structs'
// defaults are what --help shows).
// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --presence-penalty,
// --frequency-penalty (--seed is each command's: its default is no fixed value).
void add_sampling_flags(ArgParser& p, SamplingParams& sp);
// -t, --threads N; `threads` should hold default_threads() (shown as "number of cores").
void add_threads_flag(ArgParser& p, int32_t& threads);
// The adaptive expert policy's --adaptive-mass X and --adaptive-min-k N (each command
// declares --expert-policy with its own help).
void add_adaptive_policy_flags(ArgParser& p, float& mass, int32_t& min_k);
// -ctk, --cache-type-k TYPE and -ctv, --cache-type-v TYPE (llama.cpp's flags): the KV cache
// types f32, f16, bf16, q8_0, q4_0 (KvTypes' default: f16 both).
void add_kv_cache_flags(ArgParser& p, KvTypes& types);
// --expert-policy's value: true for adaptive, false for strict (UsageError otherwise).
bool adaptive_expert_policy(const std::string& value);

}  // namespace step35::cli
