// The continuous-batching engine. One scheduler thread owns the model's forward passes:
// every step runs one pass over all running sequences (one decode token each, with any
// drafts, plus chunks of prompts being prefilled), so the MoE experts a step selects are
// read once for all of them. Requests join and leave between steps. KV memory comes from
// one paged pool; a request is admitted only when its worst case (prompt + max_tokens,
// capped by its context) fits, so nothing can run out of memory mid-generation. Finished
// sequences leave their blocks in the prefix cache for later requests with the same prefix.
//
// The scheduler does admission, batching and fairness; what happens to one sequence in a
// step (speculation, rollback, sampling, events) is the Sequence's (sequence.h).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "engine/engine.h"
#include "engine/prefix_cache.h"
#include "engine/routing_window.h"
#include "engine/sequence.h"
#include "engine/speculative.h"
#include "exec/clock.h"
#include "exec/thread_pool.h"
#include "model/step35.h"
#include "model/workspace.h"

namespace step35 {

namespace {

// A submitted request: its sequence and what scheduling needs to know around it.
struct Request {
  uint64_t id = 0;
  Priority priority = Priority::Normal;
  EventSink sink;
  double t_submit = 0, deadline = 0, ttft = 0;
  std::unique_ptr<Sequence> seq;
  bool cancel = false;

  int priority_rank() const { return priority == Priority::LowLatency ? 0 : (priority == Priority::Normal ? 1 : 2); }
};

SequenceParams sequence_params(GenerateRequest&& request) {
  SequenceParams p;
  p.prompt = std::move(request.prompt);
  p.embeddings = std::move(request.embeddings);
  p.sampling = request.sampling;
  p.constraint = std::move(request.constraint);
  p.max_tokens = request.max_tokens;
  p.n_ctx = request.n_ctx;
  p.stop_at_eog = !request.ignore_eos;
  p.mask_eog = request.ignore_eos;
  p.min_tokens = request.min_tokens;
  p.want_logprobs = request.want_logprobs;
  p.n_top_logprobs = request.n_top_logprobs;
  if (request.expert_policy == ExpertPolicy::Adaptive)
    p.routing = RoutingPolicy{request.adaptive_mass, request.adaptive_min_k};
  return p;
}

// The KV pool's sizing for an engine's options, written once for the engine and for
// kv_budget(): the context and the longest chunk the engine uses, the blocks one sequence
// needs of each kind (full, SWA) and the bytes of a block of each kind.
struct KvSizing {
  int32_t n_ctx = 0, max_chunk = 0;
  std::pair<int64_t, int64_t> blocks_per_sequence;
  std::pair<size_t, size_t> block_bytes;
  double bytes_per_sequence() const {
    return double(blocks_per_sequence.first) * double(block_bytes.first) +
           double(blocks_per_sequence.second) * double(block_bytes.second);
  }
};

KvSizing kv_sizing(const Model& model, const EngineOptions& options) {
  KvSizing s;
  s.n_ctx = std::clamp(options.n_ctx, 2, model.hparams().n_ctx_train);
  s.max_chunk = std::min(std::max(1, options.n_batch), s.n_ctx);
  const auto layers = model.kv_layers();
  s.blocks_per_sequence = KvPool::blocks_for_sequence(layers, s.n_ctx, model.hparams().swa_window, s.max_chunk);
  s.block_bytes = KvPool::block_bytes(layers, KvPool::kDefaultBlockSize, options.kv_types);
  return s;
}

class BatchEngine final : public Engine {
 public:
  BatchEngine(const Model& model, const EngineOptions& opts) : model_(model), opts_(opts) {
    opts_.n_threads = std::max(1, opts_.n_threads);
    opts_.n_parallel = std::max(1, opts_.n_parallel);
    opts_.n_batch = std::max(1, opts_.n_batch);
    const KvSizing sizing = kv_sizing(model, opts_);
    opts_.n_ctx = sizing.n_ctx;
    opts_.max_queue = std::max(0, opts_.max_queue);
    max_chunk_ = sizing.max_chunk;
    const bool mtp = opts_.mtp > 0 && model.has_mtp();
    make_kv_pool(sizing, mtp ? kMaxDrafts : 0);  // speculation rolls rejected drafts back
    if (mtp)
      speculation_ = std::make_unique<Speculation>(model, opts_.mtp, opts_.mtp_adaptive,
                                                   opts_.n_parallel + kLowLatencyExtraSlots, opts_.n_ctx,
                                                   opts_.kv_types);
    prefix_ = std::make_unique<PrefixCache>(*kv_);
    pool_ = std::make_unique<ThreadPool>(opts_.n_threads);
    ws_.precision = opts_.precision;
    free_slots_hint_ = opts_.n_parallel;
    stats_.kv_pool_bytes = int64_t(kv_->bytes());
    stats_.kv_blocks_total = kv_->n_blocks(KvKind::Full) + kv_->n_blocks(KvKind::Swa);
    if (opts_.warm_up) warm_up();
    thread_ = std::thread([this] { loop(); });
  }

  ~BatchEngine() override { shutdown(); }

  uint64_t submit(GenerateRequest request, EventSink sink) override {
    const int32_t n_ctx = request.n_ctx > 0 ? std::min(request.n_ctx, opts_.n_ctx) : opts_.n_ctx;
    check_request(request, n_ctx);
    request.n_ctx = n_ctx;
    auto r = std::make_unique<Request>();
    r->priority = request.priority;
    r->sink = std::move(sink);
    r->t_submit = steady_seconds();
    r->deadline = request.timeout_s > 0 ? r->t_submit + request.timeout_s : 0;
    Request* raw = r.get();
    r->seq = std::make_unique<Sequence>(
        model_, *kv_, sequence_params(std::move(request)), [raw](const GenerateEvent& ev) { return raw->sink(ev); },
        speculation_.get(), opts_.prefix_cache ? prefix_.get() : nullptr);
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
    EngineStats s = stats_;
    // The mappings are fixed from construction on, so their residency can be read here.
    s.kv_resident_bytes = int64_t(kv_->resident_bytes() + (speculation_ ? speculation_->kv_resident_bytes() : 0));
    return s;
  }

  ExpertLoad expert_load() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return expert_load_;
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
  static constexpr int32_t kPrefillChunkWhileDecoding = 32;  // prompt tokens per step beside decodes

  void check_request(const GenerateRequest& request, int32_t n_ctx) const {
    if (request.prompt.empty()) throw RequestError("the prompt is empty");
    if (int64_t(request.prompt.size()) >= n_ctx)
      throw RequestError("the prompt is " + std::to_string(request.prompt.size()) +
                         " tokens, which does not fit the context of " + std::to_string(n_ctx) + " tokens");
    // Refused up front rather than cut short or waiting for room: a request never takes
    // KV blocks another request holds.
    if (request.max_tokens >= 0 && int64_t(request.prompt.size()) + request.max_tokens > n_ctx)
      throw RequestError("the prompt (" + std::to_string(request.prompt.size()) + " tokens) plus max_tokens (" +
                         std::to_string(request.max_tokens) + ") is " +
                         std::to_string(int64_t(request.prompt.size()) + request.max_tokens) +
                         " tokens, more than the context of " + std::to_string(n_ctx) + " tokens");
    size_t n_picture = 0;
    for (int32_t t : request.prompt) {
      if (t >= model_.hparams().n_vocab || (t < 0 && !request.embeddings))
        throw RequestError("token id " + std::to_string(t) + " is outside the vocabulary");
      n_picture += t < 0;
    }
    if (request.embeddings && (request.embeddings->n_embd != model_.hparams().n_embd ||
                               request.embeddings->n_rows() != n_picture ||
                               request.embeddings->rows.size() != n_picture * size_t(model_.hparams().n_embd)))
      throw RequestError("the prompt's picture rows (" + std::to_string(request.embeddings->n_rows()) + " of width " +
                         std::to_string(request.embeddings->n_embd) + ") do not match its " +
                         std::to_string(n_picture) + " picture positions of width " +
                         std::to_string(model_.hparams().n_embd));
    if (request.constraint && request.constraint->decides_end() && request.ignore_eos)
      throw RequestError("ignore_eos cannot be combined with structured output (the grammar ends the text)");
    if (request.constraint && request.constraint->decides_end() && request.min_tokens > 0)
      throw RequestError("min_tokens cannot be combined with structured output (the grammar ends the text)");
    if (request.n_top_logprobs < 0 || request.n_top_logprobs > 20)
      throw RequestError("top_logprobs must be between 0 and 20");
  }

  // The KV pool: room for every running sequence (low_latency extras included), or a byte
  // budget (--kv-mem) split between the block kinds in the proportion one sequence needs.
  void make_kv_pool(const KvSizing& sizing, int32_t keep_back) {
    const auto per_seq = sizing.blocks_per_sequence;
    swa_per_seq_ = per_seq.second;
    const int64_t slots = int64_t(opts_.n_parallel) + kLowLatencyExtraSlots;
    int64_t n_full = per_seq.first * slots, n_swa = per_seq.second * slots;
    if (opts_.kv_bytes > 0) {
      const double seqs = double(opts_.kv_bytes) / std::max(sizing.bytes_per_sequence(), 1.0);
      n_full = std::max<int64_t>(per_seq.first, int64_t(seqs * double(per_seq.first)));
      n_swa = std::max<int64_t>(per_seq.second, int64_t(seqs * double(per_seq.second)));
    }
    kv_ = std::make_unique<KvPool>(model_.kv_layers(), model_.hparams().swa_window, KvPool::kDefaultBlockSize, n_full,
                                   n_swa, keep_back, opts_.kv_types);
  }

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
      c.want_hidden = speculation_ != nullptr;
      chunks_.assign(1, c);
      model_.forward(*kv_, chunks_, out_, ws_, *pool_, ForwardOptions{opts_.precision, nullptr});
      kv_->trim_swa(seq);
    }
    kv_->free_seq(seq);
    chunks_.clear();
  }

  // ---- lifecycle of one request ------------------------------------------------------

  void emit_final(Request& r, FinishReason reason, const std::string& error = "") {
    if (!r.seq->sink_closed()) {
      GenerateEvent ev;
      ev.done = true;
      ev.reason = reason;
      ev.error = error;
      ev.n_prompt = r.seq->n_prompt();
      ev.n_cached = r.seq->n_cached();
      ev.n_generated = r.seq->n_generated();
      ev.ttft_s = r.ttft;
      ev.total_s = steady_seconds() - r.t_submit;
      r.sink(ev);
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requests_finished[int(reason)];
  }

  void finish_running(size_t i, FinishReason reason, const std::string& error = "") {
    std::unique_ptr<Request> r = std::move(running_[i]);
    running_.erase(running_.begin() + long(i));
    r->seq->release();
    if (r->seq->speculates()) {
      const SpeculationStats& s = r->seq->speculation_stats();
      std::lock_guard<std::mutex> lock(mu_);
      stats_.mtp_steps += s.steps;
      stats_.mtp_tokens += s.tokens;
      for (int k = 0; k <= kMaxDrafts; ++k) {
        stats_.mtp_drafted[k] += s.drafted[k];
        stats_.mtp_accepted[k] += s.accepted[k];
      }
    }
    emit_final(*r, reason, error);
  }

  void finish_running(const Request* r, FinishReason reason, const std::string& error = "") {
    for (size_t i = 0; i < running_.size(); ++i)
      if (running_[i].get() == r) return finish_running(i, reason, error);
  }

  // Tries to start a queued request: the sequence's prefix-cache lookup and KV reservation
  // of its worst case. False (nothing held) when the pool cannot take it now.
  bool admit(Request& r) {
    const int64_t swa_in_use = swa_per_seq_ * int64_t(running_.size() + 1);
    if (swa_per_seq_ > 0 && swa_in_use > kv_->n_blocks(KvKind::Swa)) return false;
    if (!r.seq->reserve()) return false;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.prompt_tokens_cached += uint64_t(r.seq->n_cached());
    return true;
  }

  // ---- the scheduler loop --------------------------------------------------------------

  // Takes new submissions and cancels; ends cancelled or expired requests; admits queued
  // ones, best class first, FIFO within a class.
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
    const double now = steady_seconds();
    drop_ended(cancels, now);
    std::stable_sort(queue_.begin(), queue_.end(),
                     [](const auto& a, const auto& b) { return a->priority_rank() < b->priority_rank(); });
    // None start while an exclusive change waits for the running requests to finish.
    if (!exclusive_pending()) admit_queued(now);
    std::lock_guard<std::mutex> lock(mu_);
    queued_ = int32_t(queue_.size());
    free_slots_hint_ = std::max(0, opts_.n_parallel - int32_t(running_.size()));
  }

  void drop_ended(const std::vector<uint64_t>& cancels, double now) {
    auto cancelled = [&](uint64_t id) { return std::find(cancels.begin(), cancels.end(), id) != cancels.end(); };
    for (auto it = queue_.begin(); it != queue_.end();) {
      Request& r = **it;
      if (cancelled(r.id) || (r.deadline > 0 && now > r.deadline)) {
        emit_final(r, cancelled(r.id) ? FinishReason::Cancelled : FinishReason::Timeout);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& r : running_)
      if (cancelled(r->id)) r->cancel = true;
    for (size_t i = 0; i < running_.size();) {
      Request& r = *running_[i];
      if (r.cancel)
        finish_running(i, FinishReason::Cancelled);
      else if (r.deadline > 0 && now > r.deadline)
        finish_running(i, FinishReason::Timeout);
      else
        ++i;
    }
  }

  void admit_queued(double now) {
    size_t n_ht_waiting = 0;
    for (const auto& r : queue_) n_ht_waiting += r->priority == Priority::HighThroughput;
    for (auto it = queue_.begin(); it != queue_.end();) {
      Request& r = **it;
      const int32_t limit = opts_.n_parallel + (r.priority == Priority::LowLatency ? kLowLatencyExtraSlots : 0);
      if (int32_t(running_.size()) >= limit) {
        ++it;
        continue;
      }
      // high_throughput requests wait a little for company when nothing else runs.
      if (r.priority == Priority::HighThroughput && running_.empty() && n_ht_waiting < 2 &&
          now - r.t_submit < opts_.batch_wait_ms / 1000.0) {
        ++it;
        continue;
      }
      if (!admit(r)) {
        if (running_.empty()) {
          // Nothing will free memory: this request can never fit the KV pool.
          emit_final(r, FinishReason::Error,
                     "the request needs more KV cache memory than the server has (" +
                         std::to_string(r.seq->worst_positions()) + " positions); lower max_tokens or raise --kv-mem");
          it = queue_.erase(it);
          continue;
        }
        break;  // wait for running requests to finish
      }
      running_.push_back(std::move(*it));
      it = queue_.erase(it);
    }
  }

  // Chooses this step's chunks (chunks_, batch_): decode tokens first (every decoding
  // sequence advances every step), then prompt chunks in priority order within the token
  // budget. While a low_latency prompt is being prefilled, other prompts wait so its first
  // token comes as soon as possible. False when there is nothing to run.
  bool plan_step() {
    std::vector<Request*> order;
    for (auto& r : running_) order.push_back(r.get());
    std::stable_sort(order.begin(), order.end(),
                     [](const Request* a, const Request* b) { return a->priority_rank() < b->priority_rank(); });
    bool low_latency_prefill = false;
    for (Request* r : order) low_latency_prefill |= r->seq->prefilling() && r->priority == Priority::LowLatency;
    chunks_.clear();
    batch_.clear();
    step_prompt_tokens_ = 0;
    step_k_ = 0;
    int32_t budget = max_chunk_;
    // A low_latency prompt runs alone: its first token then costs one prompt pass, not a
    // pass that also carries every running sequence's decode token (decoders lose a step).
    for (Request* r : order) {
      if (low_latency_prefill) break;
      if (r->seq->prefilling() || budget == 0) continue;
      budget -= add_chunk(r, budget);  // the pending token, plus its drafts when they fit
      step_k_ = std::max(step_k_, r->seq->step_drafts());
    }
    // While sequences decode, prompts advance in small chunks so that decode steps stay
    // short (the running users' time per token, and the wait of a low_latency request
    // arriving mid-step, are bounded by one step).
    const int32_t prefill_cap = chunks_.empty() ? max_chunk_ : std::min(max_chunk_, kPrefillChunkWhileDecoding);
    int32_t prefill_used = 0;
    for (Request* r : order) {
      if (!r->seq->prefilling() || budget == 0) continue;
      if (low_latency_prefill && r->priority != Priority::LowLatency) continue;
      if (prefill_used >= prefill_cap) continue;
      const int32_t n = add_chunk(r, std::min(budget, prefill_cap - prefill_used));
      budget -= n;
      prefill_used += n;
    }
    return !chunks_.empty();
  }

  // Adds r's chunk for this step, at most max_tokens (>= 1) tokens; returns its size.
  int32_t add_chunk(Request* r, int32_t max_tokens) {
    const bool prompt = r->seq->prefilling();
    const SeqChunk c = r->seq->plan(max_tokens);
    chunks_.push_back(c);
    batch_.push_back(r);
    if (prompt) step_prompt_tokens_ += uint64_t(c.n_tokens);
    return c.n_tokens;
  }

  // Sliding-window blocks come from the pool as positions advance; make room.
  void make_swa_room() {
    int64_t need_swa = 0;
    for (const SeqChunk& c : chunks_) need_swa += kv_->blocks_needed(*c.seq, c.seq->n_pos + c.n_tokens).second;
    if (need_swa > kv_->n_free(KvKind::Swa)) prefix_->evict(KvKind::Swa, need_swa - kv_->n_free(KvKind::Swa));
  }

  StepTrace trace_of_plan() const {
    StepTrace trace;
    trace.newest_request_id = newest_seen_id_;
    for (size_t c = 0; c < chunks_.size(); ++c)
      trace.chunks.push_back({batch_[c]->id, batch_[c]->priority, chunks_[c].n_tokens, batch_[c]->seq->prefilling()});
    return trace;
  }

  // One forward pass over the planned chunks. On failure nothing of the step can be
  // trusted: every request in it ends with the error, and the result is false.
  bool forward(double& seconds) {
    const double t0 = steady_seconds();
    try {
      model_.forward(*kv_, chunks_, out_, ws_, *pool_, ForwardOptions{opts_.precision, nullptr});
    } catch (const std::exception& e) {
      for (Request* r : batch_) {
        r->cancel = false;
        finish_running(r, FinishReason::Error, e.what());
      }
      return false;
    }
    seconds = steady_seconds() - t0;
    return true;
  }

  // Each request's share of the pass: its sequence turns rows into tokens and events;
  // the ones that ended leave.
  void consume_pass() {
    std::vector<std::pair<Request*, FinishReason>> ended;
    for (size_t c = 0; c < chunks_.size(); ++c) {
      Request& r = *batch_[c];
      const int32_t before = r.seq->n_generated();
      const std::optional<FinishReason> end = r.seq->consume(out_, c);
      const int32_t produced = r.seq->n_generated() - before;
      if (produced > 0) {
        if (before == 0) r.ttft = steady_seconds() - r.t_submit;
        std::lock_guard<std::mutex> lock(mu_);
        stats_.generated_tokens += uint64_t(produced);
      }
      if (end) ended.emplace_back(&r, *end);
    }
    for (const auto& [r, reason] : ended) finish_running(r, reason);
  }

  // One forward pass over the running requests.
  void step() {
    if (!plan_step()) return;
    // The trace is taken before the pass (which moves prompts on) and reported after it.
    StepTrace trace = opts_.on_step ? trace_of_plan() : StepTrace{};
    make_swa_room();
    double trunk_s = 0;
    if (!forward(trunk_s)) return;
    record_pass(trunk_s, trace);
    consume_pass();
    if (!speculation_) return;
    // This pass's cost first (its drafts were made after the previous one; a pass with
    // prompt chunks says nothing about the cost of verification), then the drafts of the
    // next step with the K chosen from the updated model.
    if (step_prompt_tokens_ == 0) speculation_->record_pass(step_k_, trunk_s);
    drafting_.clear();
    for (auto& r : running_) drafting_.push_back(r->seq.get());
    speculation_->draft(drafting_, *pool_, ws_, opts_.precision);
  }

  void record_pass(double trunk_s, StepTrace& trace) {
    const bool routed = routing_.add(out_.routing);
    uint64_t steps = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (routed) {
        const MoeHealth& h = routing_.health();
        stats_.router_entropy = h.router_entropy;
        stats_.mean_distinct_experts = h.mean_distinct_experts;
        stats_.expert_skew = h.expert_skew;
        stats_.adaptive_tokens = h.adaptive_tokens;
        stats_.adaptive_mean_k = h.adaptive_mean_k;
        add_expert_load(out_.routing);
      }
      steps = ++stats_.steps;
      stats_.prompt_tokens += step_prompt_tokens_;
    }
    if (opts_.on_step) {
      trace.step = steps;
      trace.forward_ms = trunk_s * 1e3;
      opts_.on_step(trace);
    }
  }

  // Under mu_: one pass's activations into the running totals.
  void add_expert_load(const RoutingStats& pass) {
    ExpertLoad& el = expert_load_;
    if (el.n_expert != pass.n_expert) el = ExpertLoad{pass.n_expert, 0, el.passes, {}};
    if (el.n_moe_layers < pass.n_moe_layers) {
      el.n_moe_layers = int32_t(pass.n_moe_layers);
      el.counts.resize(size_t(pass.n_moe_layers) * size_t(std::max(0, pass.n_expert)), 0);
    }
    for (size_t i = 0; i < el.counts.size() && i < pass.expert_counts.size(); ++i)
      el.counts[i] += uint64_t(std::max(0, pass.expert_counts[i]));
    ++el.passes;
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
    const auto [full_bytes, swa_bytes] = KvPool::block_bytes(model_.kv_layers(), kv_->block_size(), kv_->types());
    auto used = [&](KvKind k) { return kv_->n_blocks(k) - kv_->n_free(k) - prefix_->evictable(k); };
    stats_.kv_bytes_used = uint64_t(used(KvKind::Full)) * full_bytes + uint64_t(used(KvKind::Swa)) * swa_bytes;
    stats_.prefix_lookups = prefix_->lookups();
    stats_.prefix_hits = prefix_->hits();
  }

  void loop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        const bool idle = running_.empty() && incoming_.empty() && cancels_.empty() && exclusive_.empty();
        if (idle && !stopping_) {
          if (queue_.empty() && !idle_reported_ && opts_.on_idle) {
            // Once per idle period, before sleeping (outside the lock: requests may arrive).
            idle_reported_ = true;
            lock.unlock();
            opts_.on_idle();
            continue;
          }
          if (queue_.empty()) {
            cv_.wait(lock,
                     [&] { return stopping_ || !incoming_.empty() || !cancels_.empty() || !exclusive_.empty(); });
          } else {
            // Only requests waiting for company (high_throughput) or for memory.
            cv_.wait_for(lock, std::chrono::milliseconds(std::max(1, opts_.batch_wait_ms / 2)));
          }
        }
        if (stopping_) break;
        if (!idle) idle_reported_ = false;
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
  // Declared before the requests: their sequences hold blocks of these.
  std::unique_ptr<KvPool> kv_;
  std::unique_ptr<PrefixCache> prefix_;
  std::unique_ptr<Speculation> speculation_;  // null without MTP
  std::unique_ptr<ThreadPool> pool_;
  Workspace ws_;
  BatchOutput out_;
  RoutingWindow routing_;
  ExpertLoad expert_load_;  // under mu_

  // Scheduler-thread state.
  std::vector<SeqChunk> chunks_;     // this step's chunks ...
  std::vector<Request*> batch_;      // ... and whose they are
  uint64_t step_prompt_tokens_ = 0;  // prompt tokens in this step
  int32_t step_k_ = 0;               // most drafts any chunk of this step carries
  std::vector<Sequence*> drafting_;
  uint64_t newest_seen_id_ = 0;      // the newest request intake() has taken in
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
  bool idle_reported_ = false;  // on_idle ran since the engine last had work (scheduler thread)
  uint64_t next_id_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Engine> make_engine(const Model& model, const EngineOptions& options) {
  return std::make_unique<BatchEngine>(model, options);
}

KvBudget kv_budget(const Model& model, const EngineOptions& options) {
  const KvSizing sizing = kv_sizing(model, options);
  const auto per_seq = sizing.blocks_per_sequence;
  KvBudget b;
  b.per_sequence_bytes = int64_t(sizing.bytes_per_sequence());
  // A budget of B bytes makes B / per_sequence_bytes sequences' worth of blocks of each kind.
  const int64_t most_blocks = std::max(per_seq.first, per_seq.second);
  const double max_sequences = most_blocks > 0 ? double((int64_t(1) << 31) - 1) / double(most_blocks) : 1e18;
  b.max_pool_bytes = int64_t(std::min(9e18, max_sequences * double(b.per_sequence_bytes)));
  return b;
}

}  // namespace step35
