// One generation: a prompt and the tokens generated after it, with everything that belongs
// to it alone: its KV sequence, sampler, constraint, MTP speculation state and statistics.
// A step is two calls around a forward pass:
//   plan()    the chunk this sequence runs in the pass (the next part of its prompt, or its
//             pending token plus the drafts made for it);
//   consume() that pass's output: verifies the drafts and rolls rejected ones back from
//             every KV cache, trims the sliding window, samples, emits the tokens (with
//             logprobs) and says whether the sequence ended.
// Drafting for the next step goes through Speculation::draft (speculative.h), which asks
// each sequence for its draft_job(). The serving scheduler steps many sequences per pass;
// Generator (generator.h) steps one, for `step35 run`, `bench` and `eval`. So the
// speculation protocol (draft, verify, roll back, commit, trim) is written once, here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "exec/batch.h"
#include "exec/kv_cache.h"
#include "structured/constraint.h"

namespace step35 {

class Model;
class PrefixCache;

// Logit and hidden rows of positions [first, first + n) of the prompt (one chunk of it;
// n_vocab / n_embd floats per row): SequenceParams::on_prompt_rows.
using PromptRowsFn = std::function<void(int32_t first, int32_t n, const float* logits, const float* hidden)>;

struct SequenceParams {
  std::vector<int32_t> prompt;      // token ids, not empty; negative: a row of `embeddings`
  std::shared_ptr<const PromptEmbeddings> embeddings;  // pictures' rows (GenerateRequest)
  SamplingParams sampling;
  std::shared_ptr<TokenConstraint> constraint;  // optional; a constrained sequence never speculates
  int32_t max_tokens = -1;          // tokens to generate at most (< 0: until the context is full)
  int32_t n_ctx = 0;                // positions at most, prompt + generated (> prompt size)
  bool stop_at_eog = true;          // an end-of-generation token ends the sequence (not emitted)
  bool mask_eog = false;            // end-of-generation tokens are never sampled (serving's ignore_eos)
  int32_t min_tokens = 0;           // ... nor before this many tokens were generated (min_tokens)
  bool want_logprobs = false;       // fill GenerateEvent::logprob
  int32_t n_top_logprobs = 0;       // alternatives per token (0..20)
  RoutingPolicy routing;
  // Run the prompt's last token as the first decode step (with drafts), not in the prompt
  // pass: the first token then comes from a speculative step. Benchmarks and tests use it
  // to start speculating from a chosen token.
  bool last_prompt_token_pending = false;
  // Every prompt chunk returns the logits and hidden rows of all its positions to
  // on_prompt_rows (`step35 eval`).
  PromptRowsFn on_prompt_rows;
  double synthetic_accept = -1;     // benchmarks only: accept each draft with this probability
};

// Receives the sequence's tokens in order (GenerateEvent::done is false). Its answer:
// Continue; Stop (the sequence ends at this token with FinishReason::Stop, e.g. a stop
// string matched); Cancel (FinishReason::Cancelled, and no further tokens).
using TokenSink = std::function<SinkReply(const GenerateEvent&)>;

class Sequence {
 public:
  // `kv` holds the sequence's KV blocks; `speculation` (optional) drafts for it when it has
  // MTP on; `prefix` (optional) is where its computed blocks are shared and looked up.
  Sequence(const Model& model, KvPool& kv, SequenceParams params, TokenSink sink, Speculation* speculation = nullptr,
           PrefixCache* prefix = nullptr);
  ~Sequence();  // release()
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  // Admission: attaches the longest cached prefix of the prompt and takes the full-attention
  // blocks of the worst case (prompt + max_tokens, capped by the context), so the sequence
  // can never run out of KV memory later. False, holding nothing, when the pool cannot
  // take it now. Nothing else may be called before it succeeds.
  bool reserve();
  // Publishes the computed blocks to the prefix cache, frees the KV and MTP state. Idempotent.
  void release();

  bool prefilling() const { return kv_.n_pos < n_prefill_; }
  // The chunk of the next forward pass, at most max_tokens (>= 1) tokens: the next part of
  // the prompt, or the pending token with its drafts when they fit (else without them).
  SeqChunk plan(int32_t max_tokens);
  // This sequence's part of the pass that ran the planned chunk as chunk `c` of `out`
  // (its logit rows are masked in place). Returns the reason the sequence ended, if it did.
  std::optional<FinishReason> consume(BatchOutput& out, size_t c);

  // Speculation: the drafting job for the next step with K = k (nothing when the sequence
  // does not speculate, is still prefilling, already has drafts, or no draft would fit its
  // context or max_tokens); `probe`: an adaptive probe, whose MTP catch-up is kept short.
  std::optional<MtpDrafter::Job> draft_job(int32_t k, bool probe);

  int32_t n_prompt() const { return n_prompt_; }
  int32_t n_cached() const { return n_cached_; }      // prompt positions taken from the prefix cache
  int32_t n_generated() const { return n_generated_; }  // end-of-generation tokens included
  int32_t n_pos() const { return kv_.n_pos; }
  int32_t n_ctx() const { return params_.n_ctx; }
  int32_t worst_positions() const { return worst_positions_; }
  bool speculates() const { return speculates_; }
  int32_t step_drafts() const { return step_drafts_; }  // drafts in the chunk last planned
  bool sink_closed() const { return sink_closed_; }     // the sink refused a token
  const SpeculationStats& speculation_stats() const { return mtp_.stats; }
  const std::vector<int32_t>& tokens() const { return tokens_; }  // prompt, then generated

 private:
  const float* prompt_chunk_rows(const BatchOutput& out, size_t c, const float* hidden);
  void mask(float* rows) const;
  void picture_rows(SeqChunk& c);
  void verify(float* rows, const float* hidden);
  std::optional<FinishReason> emit(const float* rows);
  void fill_logprobs(const float* row, int32_t token, GenerateEvent& ev) const;

  const Model& model_;
  KvPool& pool_;
  SequenceParams params_;
  TokenSink sink_;
  Speculation* speculation_;
  PrefixCache* prefix_;
  KvSeq kv_;
  std::vector<int32_t> tokens_;
  int32_t n_prompt_ = 0;
  int32_t n_prefill_ = 0;           // prompt positions run as prompt chunks
  int32_t n_cached_ = 0;
  int32_t n_generated_ = 0;
  int32_t worst_positions_ = 0;
  std::unique_ptr<Sampler> sampler_;
  bool speculates_ = false;
  MtpState mtp_;
  // The chunk last planned.
  std::vector<int32_t> step_tokens_;
  std::vector<float> step_embeddings_;  // a prompt chunk's rows when it holds picture positions
  std::vector<int32_t> picture_row_;    // per prompt position: its row of params_.embeddings, -1 at a token
  int32_t planned_tokens_ = 0;
  int32_t step_drafts_ = 0;
  bool planned_prompt_ = false;
  std::vector<int32_t> produced_;
  bool prompt_published_ = false;
  bool sink_closed_ = false;
  bool reserved_ = false;
};

}  // namespace step35
