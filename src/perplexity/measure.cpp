#include "perplexity/measure.h"

#include "exec/thread_pool.h"

namespace step35::perplexity {

PerplexitySums measure_perplexity(ChunkRunner& runner, ThreadPool& pool, const std::vector<int32_t>& tokens,
                                  int32_t n_chunk, BaseFileWriter* base,
                                  const std::function<void(int32_t, const PerplexitySums&)>& after_chunk) {
  const int32_t n_ctx = runner.n_ctx(), first = runner.first_scored(), n_rows = runner.rows_per_chunk();
  const int32_t n_vocab = runner.n_vocab();
  const size_t words = base_row_words(n_vocab);
  std::vector<double> nll(static_cast<size_t>(n_rows));
  std::vector<uint16_t> rows(base ? size_t(n_rows) * words : 0);
  PerplexitySums sums;
  for (int32_t c = 0; c < n_chunk; ++c) {
    const int32_t* chunk = tokens.data() + size_t(c) * size_t(n_ctx);
    const std::vector<float>& logits = runner.run(chunk, pool);
    pool.parallel_for(n_rows, [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r) {
        const float* row = logits.data() + size_t(r) * size_t(n_vocab);
        const int32_t next = chunk[first + r + 1];
        nll[size_t(r)] = base ? encode_base_row(row, n_vocab, next, rows.data() + size_t(r) * words)
                              : token_nll(row, n_vocab, next);
      }
    });
    if (base) base->write_chunk(rows);
    for (double v : nll) sums.add(v);
    if (after_chunk) after_chunk(c, sums);
  }
  return sums;
}

KlMeasurement measure_kl_divergence(ChunkRunner& runner, ThreadPool& pool, BaseFileReader& base, int32_t n_chunk,
                                    const std::function<void(int32_t, const KlSums&)>& after_chunk) {
  const BaseHeader& h = base.header();
  const int32_t n_ctx = runner.n_ctx(), first = runner.first_scored(), n_rows = runner.rows_per_chunk();
  const int32_t n_vocab = runner.n_vocab();
  const size_t words = base_row_words(n_vocab);
  std::vector<KlTokenScore> scores(static_cast<size_t>(n_rows));
  std::vector<uint16_t> base_rows;
  KlMeasurement m;
  m.kld.reserve(size_t(n_rows) * size_t(n_chunk));
  m.p_diff.reserve(size_t(n_rows) * size_t(n_chunk));
  for (int32_t c = 0; c < n_chunk; ++c) {
    const int32_t* chunk = h.tokens.data() + size_t(c) * size_t(n_ctx);
    base.read_chunk(base_rows);
    const std::vector<float>& logits = runner.run(chunk, pool);
    pool.parallel_for(n_rows, [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r)
        scores[size_t(r)] = score_against_base(logits.data() + size_t(r) * size_t(n_vocab), n_vocab,
                                               base_rows.data() + size_t(r) * words, chunk[first + r + 1]);
    });
    for (const KlTokenScore& s : scores) {
      m.sums.add(s);
      m.kld.push_back(float(s.kld));
      m.p_diff.push_back(s.p_diff);
    }
    if (after_chunk) after_chunk(c, m.sums);
  }
  return m;
}

}  // namespace step35::perplexity
