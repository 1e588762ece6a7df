// Token sampling: penalties, then greedy or temperature + top-k / top-p / min-p with a
// seeded RNG, so a fixed seed reproduces a run exactly.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace step35 {

struct SamplingParams {
  float temperature = 0.8f;     // <= 0: greedy (argmax)
  int32_t top_k = 40;           // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off (llama.cpp rule: divide positive logits, multiply negative)
  int32_t repeat_last_n = 64;   // window of recent tokens the penalties look at (<= 0: none)
  float presence_penalty = 0.0f;   // OpenAI: minus this once per token seen
  float frequency_penalty = 0.0f;  // OpenAI: minus this times the count
  float typical_p = 1.0f;       // locally typical sampling mass, >= 1: off
  // Added to a token's logit before anything else (OpenAI logit_bias; -inf bans a token).
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;
};

// Order of operations (temperature > 0): logit bias, penalties over the last repeat_last_n
// accepted tokens, top-k, softmax at the temperature (over the top-k set), typical-p (the
// tokens whose surprise -log p is closest to the entropy, until their mass reaches
// typical_p, the softmax then taken over them), top-p (smallest prefix with cumulative
// probability >= top_p, at least one token), min-p (drop p < min_p * p_max), renormalise,
// one draw. Greedy (temperature <= 0) applies the bias and the penalties, then argmax.
// NaN logits count as -inf. The RNG is std::mt19937_64 and the uniform variate is built
// from its raw 64-bit output, so a seed gives the same tokens with every standard library.
// After the first sample() call neither sample() nor accept() allocates.
class Sampler {
 public:
  Sampler(const SamplingParams& params, size_t n_vocab);
  // Picks the next token from one row of logits (not modified). Penalties use the
  // tokens passed to accept() (prompt and generated) within repeat_last_n.
  int32_t sample(const float* logits);
  void accept(int32_t token);

  // The distribution sample() draws from for these logits (penalties, temperature and
  // truncation applied) as (token, probability) pairs summing to 1; greedy: the argmax
  // with probability 1. Uses no randomness. (Speculative decoding compares target and
  // draft distributions.)
  struct TokenProb {
    int32_t token;
    double p;
  };
  void distribution(const float* logits, std::vector<TokenProb>& out);
  // One uniform draw in [0, 1) from the sampler's RNG.
  double uniform();
  // The penalty history, saved and restored around speculative drafts.
  struct History {
    std::vector<int32_t> tokens;
    size_t head = 0, size = 0;
  };
  History save_history() const { return {history_, history_head_, history_size_}; }
  void restore_history(const History& h) {
    history_ = h.tokens;
    history_head_ = h.head;
    history_size_ = h.size;
  }
  void reset();  // forget history; RNG re-seeded from params.seed
  const SamplingParams& params() const { return params_; }
  size_t n_vocab() const { return n_vocab_; }
  // Index of the largest value; NaN never wins, ties go to the lowest index; 0 when no
  // value beats -inf (or n == 0).
  static int32_t argmax(const float* logits, size_t n);

 private:
  // work_ = the logits with NaN as -inf, the bias added and the penalties applied.
  void prepare(const float* logits);
  void apply_penalties();
  // Keeps the locally typical candidates among idx_[0, c); returns how many.
  size_t typical(size_t c, double max_logit, double temp);
  // Fills idx_[0, keep) / probs_[0, keep) (unnormalised) with the candidates of
  // work_ (penalised logits) at temperature > 0; returns keep (0: take argmax(work_)).
  size_t candidates();
  size_t nucleus(size_t c, float max_logit, double z);
  bool penalties_active() const;

  SamplingParams params_;
  size_t n_vocab_;
  std::mt19937_64 rng_;
  // The last repeat_last_n accepted tokens as a ring buffer (a fixed-size vector, so
  // accept() never allocates the way a deque's node churn would).
  std::vector<int32_t> history_;
  size_t history_head_ = 0;   // next slot to write
  size_t history_size_ = 0;   // valid entries (<= history_.size())
  std::vector<int32_t> counts_;  // per-token occurrences in the window; all 0 between calls
  std::vector<float> work_;      // penalised logits
  std::vector<int32_t> idx_;     // candidate token ids
  std::vector<double> probs_;    // unnormalised probabilities of the sorted candidates
  std::vector<std::pair<double, int32_t>> typical_order_;  // typical(): (score, token)
};

}  // namespace step35
