#include "perplexity/statistics.h"

#include <algorithm>
#include <cmath>

namespace step35::perplexity {

MeanError mean_and_error(double sum, double sum2, size_t count) {
  MeanError r;
  if (count < 1) return r;
  r.mean = sum / double(count);
  const double var = sum2 / double(count) - r.mean * r.mean;
  r.error = var > 0 && count > 10 ? std::sqrt(var / double(count - 1)) : 0.0;
  return r;
}

double covariance_of_means(double sum_a, double sum_b, double sum_ab, size_t count) {
  if (count < 10) return 0.0;
  const double n = double(count);
  return (sum_ab / n - (sum_a / n) * (sum_b / n)) / double(count - 1);
}

float percentile(const std::vector<float>& sorted, float fraction) {
  if (fraction <= 0) return sorted.front();
  if (fraction >= 1) return sorted.back();
  float rank = fraction * float(sorted.size() - 1);
  const size_t below = size_t(rank);
  rank -= float(below);
  return (1 - rank) * sorted[below] + rank * sorted[std::min(below + 1, sorted.size() - 1)];
}

float median(const std::vector<float>& sorted) {
  const size_t n = sorted.size();
  return n % 2 == 0 ? 0.5f * (sorted[n / 2] + sorted[n / 2 - 1]) : sorted[n / 2];
}

double PerplexitySums::ppl() const { return std::exp(nll / double(count)); }

bool PerplexitySums::ppl_error(double* error) const {
  const double mean = nll / double(count);
  const double var = nll2 / double(count) - mean * mean;
  if (!(var > 0)) return false;
  *error = std::sqrt(var / double(count - 1)) * std::exp(mean);
  return true;
}

void KlSums::add(const KlTokenScore& s) {
  nll += s.nll;
  nll2 += s.nll * s.nll;
  nll_base += s.nll_base;
  nll_base2 += s.nll_base * s.nll_base;
  nll_nll_base += s.nll * s.nll_base;
  kld += s.kld;
  kld2 += s.kld * s.kld;
  p_diff += s.p_diff;
  const double d2 = s.p_diff * s.p_diff;
  p_diff2 += d2;
  p_diff4 += d2 * d2;
  max_abs_p_diff = std::max(max_abs_p_diff, std::fabs(s.p_diff));
  n_same_top += s.same_top;
  ++count;
}

KlFigures kl_figures(const KlSums& s) {
  KlFigures f;
  f.log_ppl = mean_and_error(s.nll, s.nll2, s.count);
  f.log_ppl_base = mean_and_error(s.nll_base, s.nll_base2, s.count);
  // PPL = exp(mean nll); its error by the first-order rule d exp(x) = exp(x) dx.
  f.ppl = std::exp(f.log_ppl.mean);
  f.ppl_error = f.ppl * f.log_ppl.error;
  f.ppl_base = std::exp(f.log_ppl_base.mean);
  f.ppl_base_error = f.ppl_base * f.log_ppl_base.error;
  f.log_ppl_cov = covariance_of_means(s.nll, s.nll_base, s.nll_nll_base, s.count);
  f.log_ppl_correlation = f.log_ppl_cov / (f.log_ppl.error * f.log_ppl_base.error);
  f.log_ppl_ratio = f.log_ppl.mean - f.log_ppl_base.mean;
  f.log_ppl_ratio_error = std::sqrt(f.log_ppl.error * f.log_ppl.error +
                                    f.log_ppl_base.error * f.log_ppl_base.error - 2.0 * f.log_ppl_cov);
  f.ppl_ratio = std::exp(f.log_ppl_ratio);
  f.ppl_ratio_error = f.ppl_ratio * f.log_ppl_ratio_error;
  const double ppl_cov = f.ppl * f.ppl_base * f.log_ppl_cov;
  f.ppl_diff = f.ppl - f.ppl_base;
  f.ppl_diff_error = std::sqrt(f.ppl_error * f.ppl_error + f.ppl_base_error * f.ppl_base_error - 2.0 * ppl_cov);
  f.kld = mean_and_error(s.kld, s.kld2, s.count);
  f.p_diff = mean_and_error(s.p_diff, s.p_diff2, s.count);
  // RMS Δp = sqrt(mean Δp²), error by d sqrt(x) = dx / (2 sqrt(x)).
  const MeanError mse = mean_and_error(s.p_diff2, s.p_diff4, s.count);
  f.rms_p_diff = std::sqrt(mse.mean);
  f.rms_p_diff_error = 0.5 / f.rms_p_diff * mse.error;
  // Agreement of the top tokens as a binomial proportion.
  f.same_top = double(s.n_same_top) / double(s.count);
  f.same_top_error = std::sqrt(f.same_top * (1 - f.same_top) / double(s.count - 1));
  return f;
}

Quantiles quantiles(std::vector<float>& values) {
  std::sort(values.begin(), values.end());
  Quantiles q;
  q.max = values.back();
  q.p99_9 = percentile(values, 0.999f);
  q.p99 = percentile(values, 0.990f);
  q.p95 = percentile(values, 0.950f);
  q.p90 = percentile(values, 0.900f);
  q.p75 = percentile(values, 0.750f);
  q.median = median(values);
  q.p25 = percentile(values, 0.250f);
  q.p10 = percentile(values, 0.100f);
  q.p5 = percentile(values, 0.050f);
  q.p1 = percentile(values, 0.010f);
  q.p0_1 = percentile(values, 0.001f);
  q.min = values.front();
  return q;
}

}  // namespace step35::perplexity
