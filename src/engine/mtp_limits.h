// The most MTP drafts one step verifies (`--mtp 0..3`). The released model has three MTP
// blocks; what the KV caches keep for rolling drafts back, the per-position acceptance
// statistics and the values the command line accepts all follow from this one number.
#pragma once

#include <cstdint>

namespace step35 {

inline constexpr int32_t kMaxDrafts = 3;

}  // namespace step35
