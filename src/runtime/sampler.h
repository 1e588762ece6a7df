// Token sampling: penalties, then greedy or temperature + top-k / top-p / min-p with a
// seeded RNG, so a fixed seed reproduces a run exactly.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <vector>

namespace step35 {

struct SamplingParams {
  float temperature = 0.8f;     // <= 0: greedy (argmax)
  int32_t top_k = 40;           // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off (llama.cpp rule: divide positive logits, multiply negative)
  int32_t repeat_last_n = 64;   // window of recent tokens the penalties look at
  float presence_penalty = 0.0f;   // OpenAI: minus this once per token seen
  float frequency_penalty = 0.0f;  // OpenAI: minus this times the count
  uint64_t seed = 0;
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, size_t n_vocab);
  // Picks the next token from one row of logits (not modified). Penalties use the
  // tokens passed to accept() (prompt and generated) within repeat_last_n.
  int32_t sample(const float* logits);
  void accept(int32_t token);
  void reset();  // forget history; RNG re-seeded from params.seed
  const SamplingParams& params() const { return params_; }
  static int32_t argmax(const float* logits, size_t n);

 private:
  SamplingParams params_;
  size_t n_vocab_;
  std::mt19937_64 rng_;
  std::deque<int32_t> history_;
  std::vector<float> work_;
  std::vector<int32_t> idx_;
  std::vector<double> probs_;
};

}  // namespace step35
