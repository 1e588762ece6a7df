// One sequence at a time through the model, with a KV pool of its own: what `step35 run`,
// `bench` and `eval` generate with. The same Sequence steps as in the serving scheduler
// (plan, forward pass, consume, draft), without admission or batching.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/sequence.h"
#include "engine/speculative.h"
#include "exec/batch.h"
#include "exec/kv_cache.h"
#include "model/workspace.h"

namespace step35 {

class Model;
class ThreadPool;

struct GeneratorOptions {
  int32_t n_ctx = 4096;     // positions at most (prompt + generated)
  int32_t n_batch = 512;    // prompt tokens per forward pass at most
  Precision precision = Precision::Native;
  int32_t mtp = 0;          // MTP drafts per step at most (0: off; needs MTP blocks)
  bool mtp_adaptive = false;  // choose K per step from acceptance and measured cost
  KvTypes kv_types;         // cache types of keys and values (default f16, as llama.cpp)
};

class Generator {
 public:
  Generator(const Model& model, const GeneratorOptions& options);
  ~Generator();

  // Starts a sequence in the same memory (KV pool, MTP caches; the previous sequence is
  // dropped, the adaptive controller starts afresh). params.n_ctx 0 means the generator's.
  // Throws std::invalid_argument when the prompt does not fit the context.
  void start(SequenceParams params, TokenSink sink);
  // Runs the prompt in chunks of n_batch; the prompt's last row gives the first token.
  // Returns the reason the sequence ended, if it did.
  std::optional<FinishReason> prefill(ThreadPool& pool);
  // One decode step (drafting first when the sequence speculates): the sink gets the tokens
  // it produced. Returns the reason the sequence ended, if it did.
  std::optional<FinishReason> step(ThreadPool& pool);
  // prefill() then step() until the sequence ends.
  FinishReason run(ThreadPool& pool);

  const Sequence& sequence() const { return *seq_; }
  int32_t n_ctx() const { return options_.n_ctx; }
  int32_t max_k() const { return speculation_ ? speculation_->max_k() : 0; }
  // The speculation state (null without MTP): the drafter's test hook, the controller.
  Speculation* speculation() { return speculation_.get(); }
  std::string describe_kv() const;  // one line for logs

 private:
  std::optional<FinishReason> pass(ThreadPool& pool, int32_t max_tokens);

  const Model& model_;
  GeneratorOptions options_;
  KvPool kv_;
  std::unique_ptr<Speculation> speculation_;
  std::unique_ptr<Sequence> seq_;
  Workspace ws_;
  BatchOutput out_;
  std::vector<SeqChunk> chunks_;
  std::vector<Sequence*> drafting_;
};

}  // namespace step35
