#include "engine/sequence.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "engine/prefix_cache.h"
#include "model/step35.h"

namespace step35 {

Sequence::Sequence(const Model& model, KvPool& kv, SequenceParams params, TokenSink sink, Speculation* speculation,
                   PrefixCache* prefix)
    : model_(model),
      pool_(kv),
      params_(std::move(params)),
      sink_(std::move(sink)),
      speculation_(speculation),
      prefix_(prefix) {
  if (params_.prompt.empty()) throw std::invalid_argument("a sequence needs a prompt");
  n_prompt_ = int32_t(params_.prompt.size());
  n_prefill_ = params_.last_prompt_token_pending ? n_prompt_ - 1 : n_prompt_;
}

Sequence::~Sequence() { release(); }

bool Sequence::reserve() {
  const int32_t n_ctx = params_.n_ctx;
  const int32_t max_new = params_.max_tokens >= 0 ? params_.max_tokens : n_ctx;
  // (the last generated token is never fed back, so n_ctx positions always suffice)
  worst_positions_ = int32_t(std::min<int64_t>(n_ctx, int64_t(n_prompt_) + std::max(max_new, 1)));
  kv_ = KvSeq{};
  // At most n_prompt - 1 positions: the last prompt token must run to give logits.
  if (prefix_) n_cached_ = prefix_->attach(params_.prompt.data(), n_prompt_ - 1, kv_);
  const auto need = pool_.blocks_needed(kv_, worst_positions_);
  if (prefix_ && need.first > pool_.n_free(KvKind::Full))
    prefix_->evict(KvKind::Full, need.first - pool_.n_free(KvKind::Full));
  if (!pool_.reserve_full(kv_, worst_positions_)) {
    pool_.free_seq(kv_);
    n_cached_ = 0;
    return false;
  }
  reserved_ = true;
  tokens_ = params_.prompt;
  // Constrained sequences do not speculate (each draft would need the grammar's state).
  speculates_ = speculation_ && speculation_->max_k() > 0 && !params_.constraint;
  if (speculates_) speculation_->drafter().init(mtp_);
  if (params_.embeddings) {
    // Each picture position's row, for prompt chunks and the MTP blocks' catch-up alike.
    picture_row_.assign(params_.prompt.size(), -1);
    int32_t row = 0;
    for (size_t p = 0; p < params_.prompt.size(); ++p)
      if (params_.prompt[p] < 0) picture_row_[p] = row++;
  }
  sampler_ = std::make_unique<Sampler>(params_.sampling, size_t(model_.hparams().n_vocab));
  for (int32_t t : params_.prompt)
    if (t >= 0) sampler_->accept(t);  // (picture positions have no token to penalise)
  return true;
}

void Sequence::release() {
  if (!reserved_) return;
  reserved_ = false;
  // The computed blocks stay in the prefix cache for later prompts with the same start.
  if (prefix_ && kv_.n_pos > 0) prefix_->publish(tokens_.data(), kv_.n_pos, kv_);
  pool_.free_seq(kv_);
  if (speculates_) speculation_->drafter().release(mtp_);
}

SeqChunk Sequence::plan(int32_t max_tokens) {
  SeqChunk c;
  c.seq = &kv_;
  c.routing = params_.routing;
  planned_prompt_ = prefilling();
  step_drafts_ = 0;
  if (planned_prompt_) {
    c.n_tokens = std::min(n_prefill_ - kv_.n_pos, max_tokens);
    c.tokens = tokens_.data() + kv_.n_pos;
    c.logits = params_.on_prompt_rows             ? LogitRows::All
               : kv_.n_pos + c.n_tokens == n_prompt_ ? LogitRows::Last
                                                   : LogitRows::None;
    // The MTP blocks catch up on the prompt's last positions from its hidden rows.
    c.want_hidden = speculates_ || params_.on_prompt_rows;
    if (params_.embeddings) picture_rows(c);
  } else {
    // The pending token, plus this step's drafts when they fit.
    step_tokens_.assign(1, tokens_.back());
    if (speculates_ && !mtp_.drafts.empty() && max_tokens > int32_t(mtp_.drafts.size())) {
      step_tokens_.insert(step_tokens_.end(), mtp_.drafts.begin(), mtp_.drafts.end());
      step_drafts_ = int32_t(mtp_.drafts.size());
    } else {
      mtp_.drafts.clear();
      mtp_.q.clear();
    }
    c.tokens = step_tokens_.data();
    c.n_tokens = int32_t(step_tokens_.size());
    c.logits = LogitRows::All;
    c.want_hidden = speculates_;
  }
  planned_tokens_ = c.n_tokens;
  return c;
}

std::optional<FinishReason> Sequence::consume(BatchOutput& out, size_t c) {
  const size_t E = size_t(model_.hparams().n_embd), V = size_t(model_.hparams().n_vocab);
  const float* hidden = out.hidden_offset[c] >= 0 ? out.hidden.data() + size_t(out.hidden_offset[c]) * E : nullptr;
  float* rows = out.logits_offset[c] >= 0 ? out.logits.data() + size_t(out.logits_offset[c]) * V : nullptr;
  if (planned_prompt_) {
    rows = const_cast<float*>(prompt_chunk_rows(out, c, hidden));
    hidden = nullptr;  // (the trunk's rows are kept; verification has none to store)
  }
  if (prefix_ && !prompt_published_) {
    // Whole prompt blocks are final once computed: share them with sequences arriving
    // meanwhile, and before the window moves on, so the cache keeps their sliding-window
    // part too (a later prompt with the same prefix needs it).
    prefix_->publish(tokens_.data(), std::min(kv_.n_pos, n_prompt_), kv_);
    prompt_published_ = kv_.n_pos >= n_prompt_;
  }
  pool_.trim_swa(kv_);
  if (!rows) return std::nullopt;
  mask(rows);
  verify(rows, hidden);
  return emit(rows);
}

// A prompt chunk that holds picture positions runs on a copy of its tokens with -1 there (what
// the forward pass takes for "use the given row") and on the rows of those positions.
void Sequence::picture_rows(SeqChunk& c) {
  const int32_t first = kv_.n_pos;
  if (std::none_of(tokens_.begin() + first, tokens_.begin() + first + c.n_tokens, [](int32_t t) { return t < 0; }))
    return;
  const size_t E = size_t(params_.embeddings->n_embd);
  step_tokens_.assign(tokens_.begin() + first, tokens_.begin() + first + c.n_tokens);
  step_embeddings_.assign(size_t(c.n_tokens) * E, 0.0f);
  for (int32_t i = 0; i < c.n_tokens; ++i) {
    if (step_tokens_[size_t(i)] >= 0) continue;
    step_tokens_[size_t(i)] = -1;
    const size_t row = size_t(picture_row_[size_t(first + i)]);
    std::copy_n(params_.embeddings->rows.data() + row * E, E, step_embeddings_.data() + size_t(i) * E);
  }
  c.tokens = step_tokens_.data();
  c.embeddings = step_embeddings_.data();
}

// A prompt chunk's rows: reported (on_prompt_rows), the hidden ones kept for the MTP blocks'
// catch-up. Returns the row to sample from when the chunk ends the prompt, else null.
const float* Sequence::prompt_chunk_rows(const BatchOutput& out, size_t c, const float* hidden) {
  const size_t V = size_t(model_.hparams().n_vocab);
  const int32_t first = kv_.n_pos - planned_tokens_;
  const float* rows = out.logits_offset[c] >= 0 ? out.logits.data() + size_t(out.logits_offset[c]) * V : nullptr;
  if (params_.on_prompt_rows) params_.on_prompt_rows(first, planned_tokens_, rows, hidden);
  if (speculates_ && hidden) mtp_.trunk.put(first, hidden, planned_tokens_);
  if (!rows || kv_.n_pos != n_prompt_) return nullptr;
  // Logits of every position were asked for (on_prompt_rows): sample from the last.
  return params_.on_prompt_rows ? rows + size_t(planned_tokens_ - 1) * V : rows;
}

void Sequence::mask(float* rows) const {
  const size_t V = size_t(model_.hparams().n_vocab);
  if (params_.constraint) params_.constraint->mask(rows, V);  // (constrained sequences never draft)
  // Row i gives the token after n_generated + i others (when the drafts before it hold).
  for (int32_t i = 0; i <= step_drafts_; ++i)
    if (params_.mask_eog || n_generated_ + i < params_.min_tokens)
      for (int32_t e : model_.tokenizer().eog_ids()) rows[size_t(i) * V + size_t(e)] = -INFINITY;
}

// Turns the logit rows of this step into tokens (produced_): one row (plain decoding, or
// the end of the prompt) is sampled; with drafts, the rows of [pending, d_1 .. d_K] are
// verified and the accepted drafts plus a bonus token come out. Rejected drafts leave the
// trunk's and the MTP blocks' caches.
void Sequence::verify(float* rows, const float* hidden) {
  const size_t V = size_t(model_.hparams().n_vocab);
  const int32_t k_used = step_drafts_;
  produced_.clear();
  const int32_t accepted =
      verify_drafts(*sampler_, rows, V, mtp_.drafts, mtp_.q, params_.synthetic_accept, produced_);
  if (speculates_) {
    // The chunk ran positions N .. N + k_used; N + accepted is the last one kept.
    const int32_t N = kv_.n_pos - 1 - k_used, n_new = N + 1 + accepted;
    if (n_new < kv_.n_pos) pool_.truncate(kv_, n_new);
    if (hidden) mtp_.trunk.put(N, hidden, accepted + 1);
    speculation_->drafter().commit(mtp_, N, n_new, k_used);
    SpeculationStats& st = mtp_.stats;
    if (k_used > 0) {
      ++st.steps;
      st.tokens += uint64_t(produced_.size());
      for (int32_t i = 1; i <= k_used; ++i) {
        ++st.drafted[i];
        if (i <= accepted) ++st.accepted[i];
      }
      speculation_->record_acceptance(k_used, accepted);
    } else if (!planned_prompt_) {
      ++st.plain_steps;
    }
  }
  mtp_.drafts.clear();
  mtp_.q.clear();
  step_drafts_ = 0;
}

// Hands the produced tokens to the sink in order, until one ends the sequence.
std::optional<FinishReason> Sequence::emit(const float* rows) {
  const Tokenizer& tok = model_.tokenizer();
  const size_t V = size_t(model_.hparams().n_vocab);
  for (size_t i = 0; i < produced_.size(); ++i) {
    const int32_t next = produced_[i];
    ++n_generated_;
    if (params_.stop_at_eog && tok.is_eog(next)) return FinishReason::Stop;
    GenerateEvent ev;
    ev.token = next;
    if (params_.want_logprobs || params_.n_top_logprobs > 0) fill_logprobs(rows + i * V, next, ev);
    if (params_.constraint) params_.constraint->accept(next);
    const SinkReply reply = sink_(ev);
    if (reply == SinkReply::Cancel) {
      sink_closed_ = true;
      return FinishReason::Cancelled;
    }
    tokens_.push_back(next);
    if (reply == SinkReply::Stop) return FinishReason::Stop;
    if (params_.max_tokens >= 0 && n_generated_ >= params_.max_tokens) return FinishReason::Length;
    // Prompt + completion fit the context (the last sampled token needs no KV slot).
    if (n_prompt_ + n_generated_ >= params_.n_ctx) return FinishReason::Context;
  }
  return std::nullopt;
}

void Sequence::fill_logprobs(const float* lg, int32_t token, GenerateEvent& ev) const {
  const size_t V = size_t(model_.hparams().n_vocab);
  float mx = -INFINITY;
  for (size_t i = 0; i < V; ++i) mx = std::max(mx, lg[i]);
  double sum = 0;
  for (size_t i = 0; i < V; ++i) sum += std::exp(double(lg[i] - mx));
  const float lse = mx + float(std::log(sum));
  ev.logprob = lg[size_t(token)] - lse;
  const size_t k = std::min(V, size_t(params_.n_top_logprobs));
  if (k == 0) return;
  // Top k by insertion (k <= 20).
  std::vector<int32_t> best;
  for (size_t i = 0; i < V; ++i) {
    if (best.size() == k && !(lg[i] > lg[size_t(best.back())])) continue;
    if (best.size() < k)
      best.push_back(int32_t(i));
    else
      best.back() = int32_t(i);
    for (size_t j = best.size() - 1; j > 0 && lg[size_t(best[j])] > lg[size_t(best[j - 1])]; --j)
      std::swap(best[j], best[j - 1]);
  }
  for (int32_t id : best) ev.top.push_back({id, lg[size_t(id)] - lse});
}

std::optional<MtpDrafter::Job> Sequence::draft_job(int32_t k, bool probe) {
  // Not stepped since its last drafts (a low_latency prompt ran alone): they still stand,
  // and drafting again would find the blocks ahead of the trunk and force a catch-up.
  if (!speculates_ || prefilling() || !mtp_.drafts.empty()) return std::nullopt;
  // Drafts must fit the context and the tokens still to generate.
  int32_t kk = std::min(k, params_.n_ctx - kv_.n_pos - 2);
  if (params_.max_tokens >= 0) kk = std::min(kk, params_.max_tokens - n_generated_ - 1);
  if (kk <= 0) return std::nullopt;
  MtpDrafter::Job job;
  job.st = &mtp_;
  job.tokens = tokens_.data();
  job.n_pos = kv_.n_pos;
  job.k = kk;
  job.sampler = sampler_.get();
  if (probe) job.catch_up_window = AdaptiveK::kProbeCatchUp;
  job.routing = params_.routing;
  if (params_.embeddings) {
    job.picture_row = picture_row_.data();
    job.picture_rows = params_.embeddings->rows.data();
  }
  return job;
}

}  // namespace step35
