// Running sums over scored positions and the figures llama-perplexity derives from them
// (perplexity with its uncertainty, KL divergence, Δp, top-token agreement), with its
// formulas: a result printed by step35 is comparable digit for digit with llama.cpp's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "perplexity/token_scores.h"

namespace step35::perplexity {

// A mean and its standard error from Σx, Σx² over `count` samples:
// mean = Σx/n, error = sqrt((Σx²/n - mean²) / (n - 1)), taken as 0 when that variance is
// not positive or n <= 10 (llama.cpp's rule for the KL statistics).
struct MeanError {
  double mean = 0, error = 0;
};
MeanError mean_and_error(double sum, double sum2, size_t count);

// Covariance of the means of two samples, (Σab/n - Σa/n · Σb/n) / (n - 1); 0 below 10 samples.
double covariance_of_means(double sum_a, double sum_b, double sum_ab, size_t count);

// Linear interpolation between the two nearest ranks of an ascending `sorted` (not empty):
// rank fraction·(n-1) in float; fraction <= 0 is the minimum, >= 1 the maximum.
float percentile(const std::vector<float>& sorted, float fraction);
// Middle value of an ascending `sorted` (not empty); the mean of the two middle ones for
// an even count.
float median(const std::vector<float>& sorted);

// Plain perplexity: Σ nll and Σ nll² over the scored positions.
struct PerplexitySums {
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  void add(double token_nll) {
    nll += token_nll;
    nll2 += token_nll * token_nll;
    ++count;
  }
  double ppl() const;  // exp(mean nll)
  // The uncertainty of `Final estimate: PPL = X +/- E`: E = PPL · sqrt(var(nll) / (n - 1)).
  // False when the variance is not positive (llama.cpp then prints an error instead).
  bool ppl_error(double* error) const;
};

// The sums llama.cpp keeps for --kl-divergence (its kl_divergence_result): squares and
// products of the float scores are taken in float before they are added, as there.
struct KlSums {
  double nll = 0, nll2 = 0, nll_base = 0, nll_base2 = 0, nll_nll_base = 0;
  double kld = 0, kld2 = 0;
  double p_diff = 0, p_diff2 = 0, p_diff4 = 0;
  float max_abs_p_diff = 0;
  size_t n_same_top = 0, count = 0;
  void add(const KlTokenScore& s);
};

// Everything the KL report prints, derived from the sums (values as fractions, not %).
struct KlFigures {
  MeanError log_ppl, log_ppl_base;
  double ppl = 0, ppl_error = 0;
  double ppl_base = 0, ppl_base_error = 0;
  double log_ppl_cov = 0;            // covariance of mean ln p and mean ln p_base
  double log_ppl_correlation = 0;    // cov / (error · error_base)
  double log_ppl_ratio = 0, log_ppl_ratio_error = 0;  // mean ln(PPL(Q)/PPL(base))
  double ppl_ratio = 0, ppl_ratio_error = 0;
  double ppl_diff = 0, ppl_diff_error = 0;
  MeanError kld;
  MeanError p_diff;
  double rms_p_diff = 0, rms_p_diff_error = 0;
  double same_top = 0, same_top_error = 0;
};
KlFigures kl_figures(const KlSums& s);

// Distribution of the per-position KLD and Δp values (sorted ascending in place).
struct Quantiles {
  float max = 0, p99_9 = 0, p99 = 0, p95 = 0, p90 = 0, p75 = 0, median = 0, p25 = 0, p10 = 0, p5 = 0, p1 = 0,
        p0_1 = 0, min = 0;
};
Quantiles quantiles(std::vector<float>& values);

}  // namespace step35::perplexity
