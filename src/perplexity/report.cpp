#include "perplexity/report.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

namespace step35::perplexity {

namespace {

__attribute__((format(printf, 2, 3))) void append(std::string& out, const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) out.append(buf, std::min(size_t(n), sizeof buf - 1));
}

// The quantile lines of the KL summary, as llama.cpp prints them: all of them for Δp, all
// but the quartiles for the KL divergence.
struct QuantileLine {
  const char* label;
  float Quantiles::*value;
  bool in_kld;
};
constexpr QuantileLine kQuantileLines[] = {
    {"Maximum", &Quantiles::max, true},   {"99.9%  ", &Quantiles::p99_9, true}, {"99.0%  ", &Quantiles::p99, true},
    {"95.0%  ", &Quantiles::p95, true},   {"90.0%  ", &Quantiles::p90, true},   {"75.0%  ", &Quantiles::p75, false},
    {"Median ", &Quantiles::median, true}, {"25.0%  ", &Quantiles::p25, false}, {"10.0%  ", &Quantiles::p10, true},
    {" 5.0%  ", &Quantiles::p5, true},    {" 1.0%  ", &Quantiles::p1, true},    {" 0.1%  ", &Quantiles::p0_1, true},
    {"Minimum", &Quantiles::min, true},
};

}  // namespace

std::string running_estimate(int32_t chunk_index, const PerplexitySums& sums) {
  std::string s;
  append(s, "[%d]%.4lf,", chunk_index + 1, sums.ppl());
  return s;
}

std::string final_estimate(const PerplexitySums& sums) {
  double error = 0;
  if (!sums.ppl_error(&error)) return "Unexpected negative standard deviation of log(prob)\n";
  std::string s;
  append(s, "Final estimate: PPL = %.4lf +/- %.5lf\n", sums.ppl(), error);
  return s;
}

std::string kl_table_header() {
  return "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              "
         "\xCE\x94p RMS            Same top p\n";
}

std::string kl_chunk_line(int32_t chunk_index, const KlSums& sums) {
  const KlFigures f = kl_figures(sums);
  std::string s;
  append(s, "%4d", chunk_index + 1);
  append(s, "    %9.4lf \xC2\xB1 %9.4lf", f.ppl, f.ppl_error);
  append(s, "    %10.5lf \xC2\xB1 %10.5lf", f.log_ppl_ratio, f.log_ppl_ratio_error);
  append(s, "    %10.5lf \xC2\xB1 %10.5lf", f.kld.mean, f.kld.error);
  append(s, "    %6.3lf \xC2\xB1 %6.3lf %%", 100.0 * f.rms_p_diff, 100.0 * f.rms_p_diff_error);
  append(s, "    %6.3lf \xC2\xB1 %6.3lf %%", 100.0 * f.same_top, 100.0 * f.same_top_error);
  s += "\n";
  return s;
}

std::string kl_summary(const KlSums& sums, std::vector<float>& kld, std::vector<float>& p_diff) {
  std::string s;
  if (sums.count < kMinPositionsForSummary || kld.empty() || p_diff.empty()) return s;
  const KlFigures f = kl_figures(sums);
  const Quantiles k = quantiles(kld);
  const Quantiles d = quantiles(p_diff);
  // "±" and "Δ" in UTF-8, as llama.cpp prints them.
#define PM "\xC2\xB1"
#define DELTA "\xCE\x94"
  s += "====== Perplexity statistics ======\n";
  append(s, "Mean PPL(Q)                   : %10.6lf " PM " %10.6lf\n", f.ppl, f.ppl_error);
  append(s, "Mean PPL(base)                : %10.6lf " PM " %10.6lf\n", f.ppl_base, f.ppl_base_error);
  append(s, "Cor(ln(PPL(Q)), ln(PPL(base))): %6.2lf%%\n", 100.0 * f.log_ppl_correlation);
  append(s, "Mean ln(PPL(Q)/PPL(base))     : %10.6lf " PM " %10.6lf\n", f.log_ppl_ratio, f.log_ppl_ratio_error);
  append(s, "Mean PPL(Q)/PPL(base)         : %10.6lf " PM " %10.6lf\n", f.ppl_ratio, f.ppl_ratio_error);
  append(s, "Mean PPL(Q)-PPL(base)         : %10.6lf " PM " %10.6lf\n", f.ppl_diff, f.ppl_diff_error);
  s += "\n";
  s += "====== KL divergence statistics ======\n";
  append(s, "Mean    KLD: %10.6lf " PM " %10.6lf\n", f.kld.mean, f.kld.error);
  for (const QuantileLine& line : kQuantileLines)
    if (line.in_kld) append(s, "%s KLD: %10.6f\n", line.label, double(k.*line.value));
  s += "\n";
  s += "====== Token probability statistics ======\n";
  append(s, "Mean    " DELTA "p: %6.3lf " PM " %5.3lf %%\n", 100.0 * f.p_diff.mean, 100.0 * f.p_diff.error);
  for (const QuantileLine& line : kQuantileLines)
    append(s, "%s " DELTA "p: %6.3lf%%\n", line.label, 100.0 * d.*line.value);
  append(s, "RMS " DELTA "p    : %6.3lf " PM " %5.3lf %%\n", 100.0 * f.rms_p_diff, 100.0 * f.rms_p_diff_error);
  append(s, "Same top p: %6.3lf " PM " %5.3lf %%\n", 100.0 * f.same_top, 100.0 * f.same_top_error);
#undef PM
#undef DELTA
  return s;
}

}  // namespace step35::perplexity
