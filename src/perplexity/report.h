// The text `step35 perplexity` prints, laid out line for line as llama-perplexity prints
// it (same labels, widths and precisions), so two runs can be compared side by side.
#pragma once

#include <string>
#include <vector>

#include "perplexity/statistics.h"

namespace step35::perplexity {

// "[3]12.3456," after chunk index 2: the running perplexity estimate.
std::string running_estimate(int32_t chunk_index, const PerplexitySums& sums);
// "Final estimate: PPL = 12.3456 +/- 0.12345\n", or llama.cpp's error line when the
// variance of the token nll is not positive.
std::string final_estimate(const PerplexitySums& sums);

// Header of the per-chunk KL table, and the line after chunk index i.
std::string kl_table_header();
std::string kl_chunk_line(int32_t chunk_index, const KlSums& sums);
// Closing statistics: perplexity of both models, KL divergence and Δp distributions, RMS
// Δp, same top token. `kld` and `p_diff` are sorted in place. llama.cpp prints them only
// from 100 scored positions on (kMinPositionsForSummary); below that this returns "".
constexpr size_t kMinPositionsForSummary = 100;
std::string kl_summary(const KlSums& sums, std::vector<float>& kld, std::vector<float>& p_diff);

}  // namespace step35::perplexity
