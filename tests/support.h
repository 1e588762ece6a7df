// Shared helpers for the tests: fixture paths, reading golden files, running the CLI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace step35::testing {

std::string fixtures_dir();                 // ../shared/fixtures
std::string fixture_model(const std::string& file);   // models/<file>
std::string golden_path(const std::string& file);     // golden/<file>
std::string tmp_dir();                      // per-build scratch folder (created)
bool file_exists(const std::string& path);
std::vector<uint8_t> read_bytes(const std::string& path);
std::vector<float> read_f32(const std::string& path);
nlohmann::json read_json(const std::string& path);
void write_bytes(const std::string& path, const std::vector<uint8_t>& data);

// Gives the finished file `made` the name `path` unless a file already has it, and removes
// `made` either way. Test processes that run in parallel generate the same input; a rename
// over an existing file would unlink the inode another process has mapped, and its
// /proc/self/smaps entry would then read "(deleted)". False when neither could be done.
bool install_if_absent(const std::string& made, const std::string& path);

// Runs a shell command, returns its exit status; stdout goes to *out (if given),
// stderr to *err (if given).
int run_command(const std::string& cmd, std::string* out = nullptr, std::string* err = nullptr);
std::string step35_binary();                // the built CLI

// Path of a fixture model that is not shipped but regenerable with the reference
// generator (tiny-k-f32, tiny-b-q8_0): generated once into tmp_dir() and checked against
// manifest.json's sha256. Returns "" (and sets *why) when it cannot be made. `set`: a
// fixture set in its own folder with its own manifest.json (e.g. "vision"); its files go
// to tmp_dir()/set.
std::string regenerated_fixture(const std::string& file, std::string* why, const std::string& set = "");

// Where tests/scripts/regen_tiny_q.sh writes the unshipped tiny-q files (they need
// llama.cpp's llama-quantize): $STEP35_TINY_Q_DIR, else tmp_dir()/tiny-q-regen.
std::string tiny_q_regen_dir();

// n pseudo-random token ids in [3, 3 + range): a 32-bit LCG started at `state`, stepped
// before each id (the tests' deterministic prompts; each test derives the state from a seed).
std::vector<int32_t> lcg_tokens(int n, uint32_t state, int range);

}  // namespace step35::testing
