// The continuous-batching engine. One scheduler thread owns the model's forward passes:
// every step runs one pass over all running sequences (one decode token each, plus chunks
// of prompts being prefilled), so the MoE experts a step selects are read once for all of
// them. Requests join and leave between steps. KV memory comes from one paged pool; a
// request is admitted only when its worst case (prompt + max_tokens, capped by its
// context) fits, so nothing can run out of memory mid-generation. Finished sequences
// leave their blocks in the prefix cache for later requests with the same prefix.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "model/step35.h"
#include "model/workspace.h"
#include "engine/engine.h"
#include "engine/prefix_cache.h"
#include "engine/speculative.h"
#include "exec/thread_pool.h"

namespace step35 {

namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

struct Request {
  uint64_t id = 0;
  GenerateRequest req;
  EventSink sink;
  double t_submit = 0, deadline = 0, ttft = 0;
  KvSeq kv;
  std::vector<int32_t> tokens;  // prompt, then every sampled token
  int32_t n_prompt = 0;
  int32_t n_cached = 0;
  int32_t n_generated = 0;
  int32_t worst_positions = 0;  // full KV blocks are reserved for this many positions
  std::unique_ptr<Sampler> sampler;
  bool cancel = false;
  bool sink_closed = false;     // the sink returned false
  bool prompt_published = false;
  // MTP speculation: drafts for the next step and the tokens run this step.
  MtpState mtp;
  bool mtp_ready = false;        // mtp initialised (engine has MTP on, request allows it)
  std::vector<int32_t> step_tokens;
  int32_t step_drafts = 0;       // drafts in this step's chunk
  std::vector<int32_t> produced;

  bool prefilling() const { return kv.n_pos < n_prompt; }
  int priority_rank() const {
    return req.priority == Priority::LowLatency ? 0 : (req.priority == Priority::Normal ? 1 : 2);
  }
};

// Per-step routing numbers kept for the sliding window behind the MoE health metrics.
struct RoutingWindowEntry {
  RoutingStats stats;
};

class BatchEngine final : public Engine {
 public:
  BatchEngine(const Model& model, const EngineOptions& opts) : model_(model), opts_(opts) {
    opts_.n_threads = std::max(1, opts_.n_threads);
    opts_.n_parallel = std::max(1, opts_.n_parallel);
    opts_.n_batch = std::max(1, opts_.n_batch);
    opts_.n_ctx = std::clamp(opts_.n_ctx, 2, model.hparams().n_ctx_train);
    opts_.max_queue = std::max(0, opts_.max_queue);
    const auto layers = model.kv_layers();
    const int32_t swa_window = model.hparams().swa_window;
    max_chunk_ = std::min(opts_.n_batch, opts_.n_ctx);
    const auto per_seq = KvPool::blocks_for_sequence(layers, opts_.n_ctx, swa_window, max_chunk_);
    swa_per_seq_ = per_seq.second;
    const int64_t slots = int64_t(opts_.n_parallel) + kLowLatencyExtraSlots;
    int64_t n_full = per_seq.first * slots, n_swa = per_seq.second * slots;
    if (opts_.kv_bytes > 0) {
      // A byte budget: split between the kinds in the proportion one sequence needs.
      const auto [fb, sb] = KvPool::block_bytes(layers, KvPool::kDefaultBlockSize);
      const double per_seq_bytes = double(per_seq.first) * double(fb) + double(per_seq.second) * double(sb);
      const double seqs = double(opts_.kv_bytes) / std::max(per_seq_bytes, 1.0);
      n_full = std::max<int64_t>(per_seq.first, int64_t(seqs * double(per_seq.first)));
      n_swa = std::max<int64_t>(per_seq.second, int64_t(seqs * double(per_seq.second)));
    }
    // Speculation rolls back up to 3 rejected drafts.
    const int32_t keep_back = opts_.mtp > 0 && model.has_mtp() ? 3 : 0;
    kv_ = std::make_unique<KvPool>(layers, swa_window, KvPool::kDefaultBlockSize, n_full, n_swa, keep_back);
    if (keep_back > 0) {
      drafter_ = std::make_unique<MtpDrafter>(model, opts_.mtp, opts_.n_parallel + kLowLatencyExtraSlots, opts_.n_ctx);
      adaptive_k_ = std::make_unique<AdaptiveK>(drafter_->max_k());
      if (!opts_.mtp_adaptive) fixed_k_ = drafter_->max_k();
    }
    prefix_ = std::make_unique<PrefixCache>(*kv_);
    pool_ = std::make_unique<ThreadPool>(opts_.n_threads);
    ws_.precision = opts_.precision;
    free_slots_hint_ = opts_.n_parallel;
    if (opts_.warm_up) warm_up();
    thread_ = std::thread([this] { loop(); });
  }

  ~BatchEngine() override { shutdown(); }

  uint64_t submit(GenerateRequest request, EventSink sink) override {
    const HParams& hp = model_.hparams();
    const int32_t n_ctx = request.n_ctx > 0 ? std::min(request.n_ctx, opts_.n_ctx) : opts_.n_ctx;
    if (request.prompt.empty()) throw RequestError("the prompt is empty");
    if (int64_t(request.prompt.size()) >= n_ctx)
      throw RequestError("the prompt is " + std::to_string(request.prompt.size()) +
                         " tokens, which does not fit the context of " + std::to_string(n_ctx) + " tokens");
    for (int32_t t : request.prompt)
      if (t < 0 || t >= hp.n_vocab) throw RequestError("token id " + std::to_string(t) + " is outside the vocabulary");
    if (request.constraint && request.ignore_eos)
      throw RequestError("ignore_eos cannot be combined with structured output (the grammar ends the text)");
    if (request.n_top_logprobs < 0 || request.n_top_logprobs > 20)
      throw RequestError("top_logprobs must be between 0 and 20");
    request.n_ctx = n_ctx;
    auto r = std::make_unique<Request>();
    r->req = std::move(request);
    r->sink = std::move(sink);
    r->t_submit = now_s();
    r->deadline = r->req.timeout_s > 0 ? r->t_submit + r->req.timeout_s : 0;
    r->n_prompt = int32_t(r->req.prompt.size());
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw QueueFullError("the server is shutting down");
    if (int32_t(incoming_.size() + queued_) >= opts_.max_queue + free_slots_hint_)
      throw QueueFullError("the request queue is full (" + std::to_string(incoming_.size() + queued_) + " waiting)");
    r->id = ++next_id_;
    ++stats_.requests_submitted;
    const uint64_t id = r->id;
    incoming_.push_back(std::move(r));
    cv_.notify_all();
    return id;
  }

  void cancel(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
    cv_.notify_all();
  }

  EngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

  const Model& model() const override { return model_; }
  const EngineOptions& options() const override { return opts_; }

  void run_exclusive(std::function<void()> change) override {
    auto task = std::make_shared<ExclusiveTask>();
    task->change = std::move(change);
    std::future<void> done = task->done.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) throw std::runtime_error("the engine is shutting down");
      exclusive_.push_back(task);
      cv_.notify_all();
    }
    done.get();
  }

 private:
  // A run_exclusive() call waiting for the running requests to finish.
  struct ExclusiveTask {
    std::function<void()> change;
    std::promise<void> done;
  };

  // Runs the pending exclusive changes once no request runs (scheduler thread).
  void run_exclusive_tasks() {
    if (!running_.empty()) return;
    std::deque<std::shared_ptr<ExclusiveTask>> tasks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks.swap(exclusive_);
    }
    for (auto& t : tasks) {
      try {
        t->change();
        t->done.set_value();
      } catch (...) {
        t->done.set_exception(std::current_exception());
      }
    }
    // Cached prompt blocks hold keys and values computed before the change.
    if (!tasks.empty()) prefix_->clear();
  }

  bool exclusive_pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !exclusive_.empty();
  }

  static constexpr int32_t kLowLatencyExtraSlots = 2;  // low_latency may run beyond n_parallel
  static constexpr size_t kRoutingWindow = 64;         // steps behind the MoE health metrics
  static constexpr int32_t kPrefillChunkWhileDecoding = 32;  // prompt tokens per step beside decodes

  // A prompt pass and a decode step over a throwaway sequence: the weights the first
  // requests need are paged in and the work buffers grown before anyone waits on them.
  // A prompt of spread-out token ids routes to many experts.
  void warm_up() {
    const int32_t n = std::max(1, std::min({32, max_chunk_, opts_.n_ctx - 2}));
    const int32_t V = model_.hparams().n_vocab;
    std::vector<int32_t> tokens;
    for (int32_t i = 0; i <= n; ++i) tokens.push_back(int32_t((int64_t(i) * 7919 + 11) % V));
    KvSeq seq;
    if (!kv_->reserve_full(seq, n + 1)) return;
    for (int pass = 0; pass < 2; ++pass) {
      SeqChunk c;
      c.seq = &seq;
      c.tokens = tokens.data() + (pass == 0 ? 0 : n);
      c.n_tokens = pass == 0 ? n : 1;
      c.logits = pass == 0 ? LogitRows::Last : LogitRows::All;
      c.want_hidden = drafter_ != nullptr;
      chunks_.assign(1, c);
      model_.forward(*kv_, chunks_, out_, ws_, *pool_, ForwardOptions{opts_.precision, nullptr});
      kv_->trim_swa(seq);
    }
    kv_->free_seq(seq);
    chunks_.clear();
  }

  // ---- lifecycle of one request ------------------------------------------------------

  void emit_final(Request& r, FinishReason reason, const std::string& error = "") {
    if (!r.sink_closed) {
      GenerateEvent ev;
      ev.done = true;
      ev.reason = reason;
      ev.error = error;
      ev.n_prompt = r.n_prompt;
      ev.n_cached = r.n_cached;
      ev.n_generated = r.n_generated;
      ev.ttft_s = r.ttft;
      ev.total_s = now_s() - r.t_submit;
      r.sink(ev);
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requests_finished[int(reason)];
  }

  // Leaves the sequence's computed blocks to the prefix cache and frees the rest.
  void release(Request& r) {
    if (opts_.prefix_cache && r.kv.n_pos > 0) prefix_->publish(r.tokens.data(), r.kv.n_pos, r.kv);
    kv_->free_seq(r.kv);
    if (r.mtp_ready) {
      drafter_->release(r.mtp);
      std::lock_guard<std::mutex> lock(mu_);
      stats_.mtp_steps += r.mtp.stats.steps;
      stats_.mtp_tokens += r.mtp.stats.tokens;
      for (int k = 0; k < 4; ++k) {
        stats_.mtp_drafted[k] += r.mtp.stats.drafted[k];
        stats_.mtp_accepted[k] += r.mtp.stats.accepted[k];
      }
    }
  }

  void finish_running(size_t i, FinishReason reason, const std::string& error = "") {
    std::unique_ptr<Request> r = std::move(running_[i]);
    running_.erase(running_.begin() + long(i));
    release(*r);
    emit_final(*r, reason, error);
  }

  // Tries to start a queued request: prefix-cache lookup and the KV reservation of its
  // worst case. False (nothing held) when the pool cannot take it now.
  bool admit(Request& r) {
    const int32_t max_new = r.req.max_tokens >= 0 ? r.req.max_tokens : r.req.n_ctx;
    r.worst_positions = int32_t(std::min<int64_t>(r.req.n_ctx, int64_t(r.n_prompt) + std::max(max_new, 1)));
    // (the last generated token is never fed back, so n_ctx positions always suffice)
    const int64_t swa_in_use = swa_per_seq_ * int64_t(running_.size() + 1);
    if (swa_per_seq_ > 0 && swa_in_use > kv_->n_blocks(KvKind::Swa)) return false;
    r.kv = KvSeq{};
    if (opts_.prefix_cache) {
      // At most n_prompt - 1 positions: the last prompt token must run to give logits.
      r.n_cached = prefix_->attach(r.req.prompt.data(), r.n_prompt - 1, r.kv);
    }
    const auto need = kv_->blocks_needed(r.kv, r.worst_positions);
    if (need.first > kv_->n_free(KvKind::Full)) prefix_->evict(KvKind::Full, need.first - kv_->n_free(KvKind::Full));
    if (!kv_->reserve_full(r.kv, r.worst_positions)) {
      kv_->free_seq(r.kv);
      r.n_cached = 0;
      return false;
    }
    r.tokens = r.req.prompt;
    // Constrained requests do not speculate (each draft would need the grammar's state).
    r.mtp_ready = drafter_ && drafter_->max_k() > 0 && !r.req.constraint;
    if (r.mtp_ready) drafter_->init(r.mtp);
    r.sampler = std::make_unique<Sampler>(r.req.sampling, size_t(model_.hparams().n_vocab));
    for (int32_t t : r.req.prompt) r.sampler->accept(t);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.prompt_tokens_cached += uint64_t(r.n_cached);
    return true;
  }

  // Turns r's logit rows of this step into tokens: one row (plain decoding, or the end of
  // the prompt) is sampled; with drafts, rows for [pending, d_1 .. d_K] are verified and the
  // accepted drafts plus a bonus token come out (rejected drafts leave every KV cache).
  // Emits the tokens and says whether r goes on.
  bool process_rows(Request& r, float* rows, const float* hidden, double* accept_out) {
    const Tokenizer& tok = model_.tokenizer();
    const size_t V = size_t(model_.hparams().n_vocab);
    const int32_t k_used = r.step_drafts;
    if (r.req.constraint) r.req.constraint->mask(rows, V);  // (constrained requests never draft)
    if (r.req.ignore_eos)
      for (int32_t i = 0; i <= k_used; ++i)
        for (int32_t e : tok.eog_ids()) rows[size_t(i) * V + size_t(e)] = -INFINITY;
    r.produced.clear();
    const int32_t accepted = verify_drafts(*r.sampler, rows, V, r.mtp.drafts, r.mtp.q, -1, r.produced);
    if (r.mtp_ready) {
      // The chunk ran positions N .. N + k_used; N + accepted is the last one kept.
      const int32_t N = r.kv.n_pos - 1 - k_used, n_new = N + 1 + accepted;
      if (n_new < r.kv.n_pos) kv_->truncate(r.kv, n_new);
      if (hidden) r.mtp.trunk.put(N, hidden, accepted + 1);
      drafter_->commit(r.mtp, N, n_new, k_used);
      if (k_used > 0) {
        ++r.mtp.stats.steps;
        r.mtp.stats.tokens += uint64_t(r.produced.size());
        for (int32_t i = 1; i <= k_used; ++i) {
          ++r.mtp.stats.drafted[i];
          if (i <= accepted) ++r.mtp.stats.accepted[i];
        }
        adaptive_k_->record_acceptance(k_used, accepted);
        *accept_out += accepted;
      }
    }
    r.mtp.drafts.clear();
    r.mtp.q.clear();
    r.step_drafts = 0;
    for (size_t i = 0; i < r.produced.size(); ++i) {
      const int32_t next = r.produced[i];
      const float* row = rows + i * V;
      if (r.n_generated == 0) r.ttft = now_s() - r.t_submit;
      ++r.n_generated;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.generated_tokens;
      }
      if (tok.is_eog(next) && !r.req.ignore_eos) return finish_reason_ = FinishReason::Stop, false;
      GenerateEvent ev;
      ev.token = next;
      if (r.req.want_logprobs || r.req.n_top_logprobs > 0) fill_logprobs(r, row, next, ev);
      if (r.req.constraint) r.req.constraint->accept(next);
      if (!r.sink(ev)) {
        r.sink_closed = true;
        return finish_reason_ = FinishReason::Cancelled, false;
      }
      r.tokens.push_back(next);
      if (r.req.max_tokens >= 0 && r.n_generated >= r.req.max_tokens)
        return finish_reason_ = FinishReason::Length, false;
      // Prompt + completion fit the context (the last sampled token needs no KV slot).
      if (r.n_prompt + r.n_generated >= r.req.n_ctx) return finish_reason_ = FinishReason::Context, false;
    }
    return true;
  }

  // Drafts the next step's tokens for every decoding request that speculates.
  void draft_next(double* draft_s) {
    draft_catch_up_ = 0;
    if (!drafter_ || drafter_->max_k() == 0) return;
    int32_t n_decoding = 0;
    for (auto& r : running_) n_decoding += !r->prefilling();
    if (n_decoding == 0) return;
    const int32_t k = fixed_k_ >= 0 ? fixed_k_ : adaptive_k_->choose();
    last_k_ = k;
    mtp_jobs_.clear();
    for (auto& rp : running_) {
      Request& r = *rp;
      if (!r.mtp_ready || r.prefilling()) continue;
      // Not stepped this time (a low_latency prompt ran alone): its drafts still stand, and
      // drafting again would find the blocks ahead of the trunk and force a catch-up.
      if (!r.mtp.drafts.empty()) continue;
      // Drafts must fit the context and the request's remaining tokens.
      int32_t kk = std::min(k, r.req.n_ctx - r.kv.n_pos - 2);
      if (r.req.max_tokens >= 0) kk = std::min(kk, r.req.max_tokens - r.n_generated - 1);
      if (kk <= 0) continue;
      MtpDrafter::Job job;
      job.st = &r.mtp;
      job.tokens = r.tokens.data();
      job.n_pos = r.kv.n_pos;
      job.k = kk;
      job.sampler = r.sampler.get();
      if (fixed_k_ < 0 && adaptive_k_->last_was_probe()) job.catch_up_window = AdaptiveK::kProbeCatchUp;
      if (r.req.expert_policy == ExpertPolicy::Adaptive)
        job.routing = RoutingPolicy{r.req.adaptive_mass, r.req.adaptive_min_k};
      mtp_jobs_.push_back(job);
    }
    if (mtp_jobs_.empty()) return;
    const double t0 = now_s();
    try {
      drafter_->draft(mtp_jobs_, *pool_, ws_, opts_.precision);
    } catch (const std::exception&) {
      // Drafting is an optimisation: on any failure (e.g. MTP cache memory) run plainly.
      for (auto& j : mtp_jobs_) j.st->drafts.clear(), j.st->q.clear(), j.st->synced = false;
    }
    *draft_s = now_s() - t0;
    draft_catch_up_ = drafter_->catch_up_tokens();
  }

  void fill_logprobs(const Request& r, const float* lg, int32_t next, GenerateEvent& ev) {
    const size_t V = size_t(model_.hparams().n_vocab);
    float mx = -INFINITY;
    for (size_t i = 0; i < V; ++i) mx = std::max(mx, lg[i]);
    double sum = 0;
    for (size_t i = 0; i < V; ++i) sum += std::exp(double(lg[i] - mx));
    const float lse = mx + float(std::log(sum));
    ev.logprob = lg[size_t(next)] - lse;
    const size_t k = std::min(V, size_t(r.req.n_top_logprobs));
    if (k == 0) return;
    // Top k by insertion (k <= 20).
    std::vector<int32_t> best;
    for (size_t i = 0; i < V; ++i) {
      if (best.size() == k && !(lg[i] > lg[size_t(best.back())])) continue;
      if (best.size() < k) best.push_back(int32_t(i));
      else best.back() = int32_t(i);
      for (size_t j = best.size() - 1; j > 0 && lg[size_t(best[j])] > lg[size_t(best[j - 1])]; --j)
        std::swap(best[j], best[j - 1]);
    }
    for (int32_t id : best) ev.top.push_back({id, lg[size_t(id)] - lse});
  }

  // ---- the scheduler loop --------------------------------------------------------------

  // Takes new submissions and cancels; drops cancelled or expired queued requests.
  void intake() {
    std::vector<uint64_t> cancels;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& r : incoming_) {
        newest_seen_id_ = std::max(newest_seen_id_, r->id);
        queue_.push_back(std::move(r));
      }
      incoming_.clear();
      cancels.swap(cancels_);
    }
    const double now = now_s();
    for (auto it = queue_.begin(); it != queue_.end();) {
      Request& r = **it;
      const bool cancelled = std::find(cancels.begin(), cancels.end(), r.id) != cancels.end();
      if (cancelled || (r.deadline > 0 && now > r.deadline)) {
        emit_final(r, cancelled ? FinishReason::Cancelled : FinishReason::Timeout);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& r : running_)
      if (std::find(cancels.begin(), cancels.end(), r->id) != cancels.end()) r->cancel = true;
    for (size_t i = 0; i < running_.size();) {
      Request& r = *running_[i];
      if (r.cancel)
        finish_running(i, FinishReason::Cancelled);
      else if (r.deadline > 0 && now > r.deadline)
        finish_running(i, FinishReason::Timeout);
      else
        ++i;
    }
    // Admission, best class first, FIFO within a class; none while an exclusive change
    // waits for the running requests to finish.
    if (exclusive_pending()) {
      std::lock_guard<std::mutex> lock(mu_);
      queued_ = int32_t(queue_.size());
      free_slots_hint_ = std::max(0, opts_.n_parallel - int32_t(running_.size()));
      return;
    }
    std::stable_sort(queue_.begin(), queue_.end(),
                     [](const auto& a, const auto& b) { return a->priority_rank() < b->priority_rank(); });
    size_t n_ht_waiting = 0;
    for (const auto& r : queue_) n_ht_waiting += r->req.priority == Priority::HighThroughput;
    for (auto it = queue_.begin(); it != queue_.end();) {
      Request& r = **it;
      const bool low_latency = r.req.priority == Priority::LowLatency;
      const int32_t limit = opts_.n_parallel + (low_latency ? kLowLatencyExtraSlots : 0);
      if (int32_t(running_.size()) >= limit) {
        ++it;
        continue;
      }
      // high_throughput requests wait a little for company when nothing else runs.
      if (r.req.priority == Priority::HighThroughput && running_.empty() && n_ht_waiting < 2 &&
          now - r.t_submit < opts_.batch_wait_ms / 1000.0) {
        ++it;
        continue;
      }
      if (!admit(r)) {
        if (running_.empty()) {
          // Nothing will free memory: this request can never fit the KV pool.
          emit_final(r, FinishReason::Error,
                     "the request needs more KV cache memory than the server has (" +
                         std::to_string(r.worst_positions) + " positions); lower max_tokens or raise --kv-mem");
          it = queue_.erase(it);
          continue;
        }
        break;  // wait for running requests to finish
      }
      running_.push_back(std::move(*it));
      it = queue_.erase(it);
    }
    std::lock_guard<std::mutex> lock(mu_);
    queued_ = int32_t(queue_.size());
    free_slots_hint_ = std::max(0, opts_.n_parallel - int32_t(running_.size()));
  }

  // One forward pass over the running requests.
  void step() {
    // Decode tokens first (every decoding sequence advances every step), then prompt
    // chunks in priority order within the token budget. While a low_latency prompt is
    // being prefilled, other prompts wait so its first token comes as soon as possible.
    std::vector<Request*> order;
    for (auto& r : running_) order.push_back(r.get());
    std::stable_sort(order.begin(), order.end(),
                     [](const Request* a, const Request* b) { return a->priority_rank() < b->priority_rank(); });
    bool low_latency_prefill = false;
    for (Request* r : order) low_latency_prefill |= r->prefilling() && r->req.priority == Priority::LowLatency;
    chunks_.clear();
    batch_reqs_.clear();
    int32_t budget = max_chunk_;
    for (Request* r : order) {
      // A low_latency prompt runs alone: its first token then costs one prompt pass, not a
      // pass that also carries every running sequence's decode token (decoders lose a step).
      if (low_latency_prefill) break;
      if (r->prefilling() || budget == 0) continue;
      // The pending token, plus this step's drafts when the request speculates.
      r->step_tokens.assign(1, r->tokens.back());
      r->step_drafts = 0;
      if (r->mtp_ready && !r->mtp.drafts.empty() && budget > int32_t(r->mtp.drafts.size())) {
        r->step_tokens.insert(r->step_tokens.end(), r->mtp.drafts.begin(), r->mtp.drafts.end());
        r->step_drafts = int32_t(r->mtp.drafts.size());
      } else {
        r->mtp.drafts.clear();
        r->mtp.q.clear();
      }
      SeqChunk c;
      c.seq = &r->kv;
      c.tokens = r->step_tokens.data();
      c.n_tokens = int32_t(r->step_tokens.size());
      c.logits = LogitRows::All;
      c.want_hidden = r->mtp_ready;
      budget -= c.n_tokens - 1;
      if (r->req.expert_policy == ExpertPolicy::Adaptive)
        c.routing = RoutingPolicy{r->req.adaptive_mass, r->req.adaptive_min_k};
      chunks_.push_back(c);
      batch_reqs_.push_back(r);
      --budget;
    }
    // While sequences decode, prompts advance in small chunks so that decode steps stay
    // short (the running users' time per token, and the wait of a low_latency request
    // arriving mid-step, are bounded by one step).
    const int32_t prefill_cap = chunks_.empty() ? max_chunk_ : std::min(max_chunk_, kPrefillChunkWhileDecoding);
    int32_t prefill_used = 0;
    for (Request* r : order) {
      if (!r->prefilling() || budget == 0) continue;
      if (low_latency_prefill && r->req.priority != Priority::LowLatency) continue;
      const int32_t n = std::min({r->n_prompt - r->kv.n_pos, budget, prefill_cap - prefill_used});
      if (n <= 0) continue;
      SeqChunk c;
      c.seq = &r->kv;
      c.tokens = r->tokens.data() + r->kv.n_pos;
      c.n_tokens = n;
      c.logits = r->kv.n_pos + n == r->n_prompt ? LogitRows::Last : LogitRows::None;
      c.want_hidden = r->mtp_ready;  // MTP blocks catch up on the prompt's last positions
      if (r->req.expert_policy == ExpertPolicy::Adaptive)
        c.routing = RoutingPolicy{r->req.adaptive_mass, r->req.adaptive_min_k};
      chunks_.push_back(c);
      batch_reqs_.push_back(r);
      budget -= n;
      prefill_used += n;
    }
    if (chunks_.empty()) return;
    // The trace is taken before the pass (which moves prompts on) and reported after it.
    StepTrace trace;
    if (opts_.on_step) {
      trace.newest_request_id = newest_seen_id_;
      for (size_t c = 0; c < chunks_.size(); ++c)
        trace.chunks.push_back({batch_reqs_[c]->id, batch_reqs_[c]->req.priority, chunks_[c].n_tokens,
                                batch_reqs_[c]->prefilling()});
    }

    // Sliding-window blocks come from the pool as positions advance; make room.
    int64_t need_swa = 0;
    for (const SeqChunk& c : chunks_) need_swa += kv_->blocks_needed(*c.seq, c.seq->n_pos + c.n_tokens).second;
    if (need_swa > kv_->n_free(KvKind::Swa)) prefix_->evict(KvKind::Swa, need_swa - kv_->n_free(KvKind::Swa));

    uint64_t prefill_tokens = 0;
    for (size_t c = 0; c < chunks_.size(); ++c)
      if (batch_reqs_[c]->kv.n_pos < batch_reqs_[c]->n_prompt) prefill_tokens += uint64_t(chunks_[c].n_tokens);
    const double t_fwd = now_s();
    try {
      model_.forward(*kv_, chunks_, out_, ws_, *pool_, ForwardOptions{opts_.precision, nullptr});
    } catch (const std::exception& e) {
      // Nothing of this step can be trusted: every request in it ends with the error.
      for (Request* r : batch_reqs_) {
        r->cancel = false;
        for (size_t i = 0; i < running_.size(); ++i)
          if (running_[i].get() == r) {
            finish_running(i, FinishReason::Error, e.what());
            break;
          }
      }
      return;
    }
    const double trunk_s = now_s() - t_fwd;
    record_routing(out_.routing);
    uint64_t steps = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      steps = ++stats_.steps;
      stats_.prompt_tokens += prefill_tokens;
    }
    if (opts_.on_step) {
      trace.step = steps;
      trace.forward_ms = trunk_s * 1e3;
      opts_.on_step(trace);
    }
    const size_t V = size_t(model_.hparams().n_vocab), E = size_t(model_.hparams().n_embd);
    std::vector<Request*> done;
    std::vector<FinishReason> reasons;
    double accepted_sum = 0;
    int32_t step_k = 0;
    for (size_t c = 0; c < chunks_.size(); ++c) {
      Request& r = *batch_reqs_[c];
      const float* hidden =
          out_.hidden_offset[c] >= 0 ? out_.hidden.data() + size_t(out_.hidden_offset[c]) * E : nullptr;
      if (r.mtp_ready && hidden && chunks_[c].logits != LogitRows::All) {
        // A prompt chunk: keep its hidden rows for the MTP blocks' catch-up.
        r.mtp.trunk.put(r.kv.n_pos - chunks_[c].n_tokens, hidden, chunks_[c].n_tokens);
        hidden = nullptr;
      }
      step_k = std::max(step_k, r.step_drafts);
      if (opts_.prefix_cache && !r.prompt_published) {
        // Whole prompt blocks are final once computed: share them with requests arriving
        // meanwhile, and before the window moves on, so the cache keeps their
        // sliding-window part too (a later prompt with the same prefix needs it).
        prefix_->publish(r.tokens.data(), std::min(r.kv.n_pos, r.n_prompt), r.kv);
        r.prompt_published = !r.prefilling();
      }
      kv_->trim_swa(r.kv);
      if (out_.logits_offset[c] < 0) continue;
      float* row = out_.logits.data() + size_t(out_.logits_offset[c]) * V;
      if (!process_rows(r, row, hidden, &accepted_sum)) {
        done.push_back(&r);
        reasons.push_back(finish_reason_);
      }
    }
    (void)accepted_sum;
    for (size_t d = 0; d < done.size(); ++d)
      for (size_t i = 0; i < running_.size(); ++i)
        if (running_[i].get() == done[d]) {
          finish_running(i, reasons[d]);
          break;
        }
    // This step's costs first (its drafts were made after the previous step), then the
    // drafts of the next step with the K chosen from the updated model.
    // Steps with prompt chunks say nothing about the cost of verification.
    if (drafter_ && drafter_->max_k() > 0 && prefill_tokens == 0)
      adaptive_k_->record_cost(step_k, trunk_s, draft_s_last_, draft_catch_up_);
    double draft_s = 0;
    draft_next(&draft_s);
    draft_s_last_ = draft_s;
  }

  void record_routing(const RoutingStats& rs) {
    if (rs.n_moe_layers == 0) return;
    routing_window_.push_back(rs);
    if (routing_window_.size() > kRoutingWindow) routing_window_.pop_front();
    // Aggregate over the window.
    double entropy = 0, distinct = 0, skew = 0;
    int64_t pairs = 0, layer_steps = 0;
    const int32_t X = std::max(1, rs.n_expert);
    const int64_t n_layers = rs.n_moe_layers;
    std::vector<int64_t> counts(size_t(n_layers * X), 0);
    for (const auto& w : routing_window_) {
      entropy += w.entropy_sum;
      pairs += w.token_layer_pairs;
      distinct += double(w.distinct_experts_sum);
      layer_steps += w.n_moe_layers;
      for (size_t i = 0; i < counts.size() && i < w.expert_counts.size(); ++i) counts[i] += w.expert_counts[i];
    }
    for (int64_t l = 0; l < n_layers; ++l) {
      int64_t mx = 0, total = 0;
      for (int32_t e = 0; e < X; ++e) {
        mx = std::max(mx, counts[size_t(l * X + e)]);
        total += counts[size_t(l * X + e)];
      }
      if (total > 0) skew += double(mx) / (double(total) / double(X));
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.router_entropy = pairs ? entropy / double(pairs) : 0;
    stats_.mean_distinct_experts = layer_steps ? distinct / double(layer_steps) : 0;
    stats_.expert_skew = skew / double(n_layers);
    stats_.adaptive_tokens += uint64_t(rs.adaptive_tokens);
    adaptive_experts_total_ += uint64_t(rs.adaptive_experts);
    stats_.adaptive_mean_k =
        stats_.adaptive_tokens ? double(adaptive_experts_total_) / double(stats_.adaptive_tokens) : 0;
  }

  void publish_stats() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.queue_depth = int32_t(queue_.size() + incoming_.size());
    stats_.running = int32_t(running_.size());
    stats_.kv_blocks_total = kv_->n_blocks(KvKind::Full) + kv_->n_blocks(KvKind::Swa);
    const int64_t cached = prefix_->evictable(KvKind::Full) + prefix_->evictable(KvKind::Swa);
    const int64_t free = kv_->n_free(KvKind::Full) + kv_->n_free(KvKind::Swa);
    stats_.kv_blocks_cached = cached;
    stats_.kv_blocks_used = stats_.kv_blocks_total - free - cached;
    stats_.prefix_lookups = prefix_->lookups();
    stats_.prefix_hits = prefix_->hits();
  }

  void loop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        const bool idle = running_.empty() && incoming_.empty() && cancels_.empty() && exclusive_.empty();
        if (idle && !stopping_) {
          if (queue_.empty()) {
            cv_.wait(lock,
                     [&] { return stopping_ || !incoming_.empty() || !cancels_.empty() || !exclusive_.empty(); });
          } else {
            // Only requests waiting for company (high_throughput) or for memory.
            cv_.wait_for(lock, std::chrono::milliseconds(std::max(1, opts_.batch_wait_ms / 2)));
          }
        }
        if (stopping_) break;
      }
      intake();
      run_exclusive_tasks();
      step();
      publish_stats();
    }
    // Shutdown: every request still here gets its final event.
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& r : incoming_) queue_.push_back(std::move(r));
      incoming_.clear();
    }
    while (!running_.empty()) finish_running(running_.size() - 1, FinishReason::Cancelled);
    for (auto& r : queue_) emit_final(*r, FinishReason::Cancelled);
    queue_.clear();
    prefix_->clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& t : exclusive_)
        t->done.set_exception(std::make_exception_ptr(std::runtime_error("the engine is shutting down")));
      exclusive_.clear();
    }
    publish_stats();
  }

  const Model& model_;
  EngineOptions opts_;
  int32_t max_chunk_ = 512;
  int64_t swa_per_seq_ = 0;
  std::unique_ptr<KvPool> kv_;
  std::unique_ptr<PrefixCache> prefix_;
  std::unique_ptr<ThreadPool> pool_;
  Workspace ws_;
  BatchOutput out_;
  std::vector<SeqChunk> chunks_;
  std::vector<Request*> batch_reqs_;
  FinishReason finish_reason_ = FinishReason::Stop;
  std::unique_ptr<MtpDrafter> drafter_;
  std::unique_ptr<AdaptiveK> adaptive_k_;
  std::vector<MtpDrafter::Job> mtp_jobs_;
  int32_t last_k_ = 0;
  uint64_t newest_seen_id_ = 0;  // the newest request intake() has taken in
  int32_t fixed_k_ = -1;  // --mtp K (not auto)
  double draft_s_last_ = 0;
  int64_t draft_catch_up_ = 0;  // positions the last drafting recomputed to catch up
  std::deque<RoutingStats> routing_window_;
  uint64_t adaptive_experts_total_ = 0;

  // Scheduler-thread state.
  std::deque<std::unique_ptr<Request>> queue_;
  std::vector<std::unique_ptr<Request>> running_;

  // Shared with submitters (under mu_).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Request>> incoming_;
  std::vector<uint64_t> cancels_;
  std::deque<std::shared_ptr<ExclusiveTask>> exclusive_;
  int32_t queued_ = 0;
  int32_t free_slots_hint_ = 0;
  EngineStats stats_;
  uint64_t next_id_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Engine> make_engine(const Model& model, const EngineOptions& options) {
  return std::make_unique<BatchEngine>(model, options);
}

}  // namespace step35
