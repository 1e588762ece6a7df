#include "perplexity/chunk_runner.h"

#include <algorithm>

namespace step35::perplexity {

ChunkRunner::ChunkRunner(const Model& model, int32_t n_ctx, int32_t max_batch, Precision precision,
                         KvTypes kv_types)
    : model_(model), n_ctx_(n_ctx), session_(model, n_ctx, std::min(max_batch, n_ctx), precision, false, 0, kv_types) {}

const std::vector<float>& ChunkRunner::run(const int32_t* tokens, ThreadPool& pool) {
  input_.assign(tokens, tokens + n_ctx_);
  const Tokenizer& vocab = model_.tokenizer();
  if (vocab.add_bos()) input_[0] = vocab.bos();
  session_.cache().clear();
  // The first half only fills the KV cache (Session computes the one logit row it must
  // return for it and nothing else); the second half keeps every row.
  const int32_t first = first_scored();
  session_.forward(input_.data(), first, false, unused_, pool);
  session_.forward(input_.data() + first, n_ctx_ - first, true, logits_, pool);
  return logits_;
}

}  // namespace step35::perplexity
