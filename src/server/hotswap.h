// Expert hot-swap (POST /v1/step35/hotswap, /v1/step35/hotswap/revert): patch files from
// `step35 finetune` swapped into the running model between requests (Engine::run_exclusive),
// with the active patches and swap counts in /metrics. Internal to src/server.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/step35.h"
#include "patch/patch.h"

namespace step35::server {

// The patches hot-swapped into the model, in order (the last one wins where they overlap),
// on top of those the server started with (--patch).
struct HotSwapState {
  struct Active {
    std::string path;
    std::shared_ptr<const patch::Patch> patch;
  };
  std::mutex swap_mu;  // one swap or revert at a time (held while it waits for running requests)
  std::mutex mu;       // the fields below (never held while waiting: /metrics reads them)
  bool have_startup = false;
  std::vector<MatrixReplacement> startup;  // the --patch replacements
  std::vector<Active> stack;
  uint64_t swaps = 0, reverts = 0, rejected = 0;
};

}  // namespace step35::server
