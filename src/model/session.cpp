#include "model/session.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace step35 {

Session::Session(const Model& model, int32_t n_ctx, int32_t max_batch, Precision precision, bool with_mtp,
                 int32_t keep_back, KvTypes kv_types)
    : model_(model),
      cache_(model.kv_layers(with_mtp), n_ctx, model.hparams().swa_window, std::min(max_batch, n_ctx), keep_back,
             kv_types) {
  ws_.precision = precision;
}

void Session::forward(const int32_t* tokens, int32_t n, bool all_logits, std::vector<float>& logits, ThreadPool& pool,
                      std::vector<float>* hidden, const DumpFn& dump, const float* embeddings) {
  if (n <= 0) throw std::invalid_argument("forward: no tokens");
  if (int64_t(cache_.n_pos()) + n > cache_.n_ctx())
    throw std::length_error("context is full: " + std::to_string(cache_.n_pos()) + " + " + std::to_string(n) +
                            " tokens exceed the context size " + std::to_string(cache_.n_ctx()));
  const int32_t V = model_.hparams().n_vocab, E = model_.hparams().n_embd;
  logits.resize(size_t(all_logits ? n : 1) * size_t(V));
  if (hidden) hidden->resize(size_t(n) * size_t(E));
  ForwardOptions opts;
  opts.precision = ws_.precision;
  opts.dump = dump;
  for (int32_t done = 0; done < n;) {
    const int32_t m = std::min(cache_.max_batch(), n - done);
    const bool last = done + m == n;
    chunks_.assign(1, SeqChunk{});
    SeqChunk& ch = chunks_[0];
    ch.seq = &cache_.seq();
    ch.tokens = tokens + done;
    ch.n_tokens = m;
    ch.embeddings = embeddings ? embeddings + size_t(done) * size_t(E) : nullptr;
    ch.logits = all_logits ? LogitRows::All : (last ? LogitRows::Last : LogitRows::None);
    ch.want_hidden = hidden != nullptr;
    ch.routing = routing_;
    model_.forward(cache_.pool(), chunks_, out_, ws_, pool, opts);
    cache_.pool().trim_swa(cache_.seq());
    if (ch.logits != LogitRows::None) {
      float* dst = logits.data() + (all_logits ? size_t(done) * size_t(V) : 0);
      std::copy(out_.logits.begin(), out_.logits.end(), dst);
    }
    if (hidden) std::copy(out_.hidden.begin(), out_.hidden.end(), hidden->begin() + ptrdiff_t(done) * E);
    done += m;
  }
}

}  // namespace step35
