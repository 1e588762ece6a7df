// First engine: one scheduler thread that steps every running sequence in turn, each
// with its own KV cache. (The batched scheduler with a paged KV pool replaces the
// stepping; the interface stays.)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "model/session.h"
#include "model/step35.h"
#include "runtime/engine.h"
#include "runtime/thread_pool.h"

namespace step35 {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Context: return "context";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Timeout: return "timeout";
    case FinishReason::Error: return "error";
  }
  return "?";
}

namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

struct Sequence {
  uint64_t id = 0;
  GenerateRequest req;
  EventSink sink;
  double t_submit = 0, deadline = 0;
  std::unique_ptr<Session> session;
  std::unique_ptr<Sampler> sampler;
  std::vector<float> logits;
  int32_t n_generated = 0;
  double ttft = 0;
  bool prefilled = false;
  bool cancel_requested = false;
};

class SerialEngine final : public Engine {
 public:
  SerialEngine(const Model& model, const EngineOptions& opts)
      : model_(model), opts_(opts), pool_(std::max(1, opts.n_threads)) {
    thread_ = std::thread([this] { loop(); });
  }
  ~SerialEngine() override { shutdown(); }

  uint64_t submit(GenerateRequest request, EventSink sink) override {
    const int32_t n_ctx = request.n_ctx > 0 ? std::min(request.n_ctx, opts_.n_ctx) : opts_.n_ctx;
    if (request.prompt.empty()) throw RequestError("the prompt is empty");
    if (int64_t(request.prompt.size()) >= n_ctx)
      throw RequestError("the prompt is " + std::to_string(request.prompt.size()) +
                         " tokens, which does not fit the context of " + std::to_string(n_ctx) + " tokens");
    const int32_t n_vocab = model_.hparams().n_vocab;
    for (int32_t t : request.prompt)
      if (t < 0 || t >= n_vocab) throw RequestError("token id " + std::to_string(t) + " is outside the vocabulary");
    request.n_ctx = n_ctx;
    auto seq = std::make_unique<Sequence>();
    seq->req = std::move(request);
    seq->sink = std::move(sink);
    seq->t_submit = now_s();
    seq->deadline = seq->req.timeout_s > 0 ? seq->t_submit + seq->req.timeout_s : 0;
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw QueueFullError("the server is shutting down");
    if (int32_t(queue_.size()) >= opts_.max_queue + std::max(0, opts_.n_parallel - int32_t(running_.size())))
      throw QueueFullError("the request queue is full (" + std::to_string(queue_.size()) + " waiting)");
    seq->id = ++next_id_;
    ++stats_.requests_submitted;
    const uint64_t id = seq->id;
    // LowLatency requests go ahead of everything queued that is not LowLatency.
    if (seq->req.priority == Priority::LowLatency) {
      auto it = std::find_if(queue_.begin(), queue_.end(),
                             [](const auto& s) { return s->req.priority != Priority::LowLatency; });
      queue_.insert(it, std::move(seq));
    } else {
      queue_.push_back(std::move(seq));
    }
    cv_.notify_all();
    return id;
  }

  void cancel(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.push_back(id);
    cv_.notify_all();
  }

  EngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    EngineStats s = stats_;
    s.queue_depth = int32_t(queue_.size());
    s.running = int32_t(running_.size());
    return s;
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ && !thread_.joinable()) return;
      stopping_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

  const Model& model() const override { return model_; }
  const EngineOptions& options() const override { return opts_; }

 private:
  void finish(Sequence& s, FinishReason reason, const std::string& error = "") {
    GenerateEvent ev;
    ev.done = true;
    ev.reason = reason;
    ev.error = error;
    ev.n_prompt = int32_t(s.req.prompt.size());
    ev.n_generated = s.n_generated;
    ev.ttft_s = s.ttft;
    ev.total_s = now_s() - s.t_submit;
    s.sink(ev);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requests_finished[int(reason)];
  }

  // One step of one sequence: prefill (first time) or one decode token. Returns false
  // when the sequence has ended.
  bool step(Sequence& s) {
    const Tokenizer& tok = model_.tokenizer();
    const size_t V = size_t(model_.hparams().n_vocab);
    if (!s.prefilled) {
      s.session = std::make_unique<Session>(model_, s.req.n_ctx, std::min(opts_.n_batch, s.req.n_ctx), opts_.precision);
      s.sampler = std::make_unique<Sampler>(s.req.sampling, V);
      for (int32_t t : s.req.prompt) s.sampler->accept(t);
      s.session->forward(s.req.prompt.data(), int32_t(s.req.prompt.size()), false, s.logits, pool_);
      s.prefilled = true;
      std::lock_guard<std::mutex> lock(mu_);
      stats_.prompt_tokens += s.req.prompt.size();
      ++stats_.steps;
    }
    // Sample from the current logits.
    std::vector<float>& lg = s.logits;
    if (s.req.constraint) s.req.constraint->mask(lg.data(), V);
    if (s.req.ignore_eos)
      for (int32_t e : tok.eog_ids()) lg[size_t(e)] = -INFINITY;
    const int32_t next = s.sampler->sample(lg.data());
    s.sampler->accept(next);
    GenerateEvent ev;
    ev.token = next;
    if (s.req.want_logprobs || s.req.n_top_logprobs > 0) {
      float mx = -INFINITY;
      for (float v : lg) mx = std::max(mx, v);
      double sum = 0;
      for (float v : lg) sum += std::exp(double(v - mx));
      const float lse = mx + float(std::log(sum));
      ev.logprob = lg[size_t(next)] - lse;
      if (s.req.n_top_logprobs > 0) {
        std::vector<int32_t> idx(V);
        for (size_t i = 0; i < V; ++i) idx[i] = int32_t(i);
        const size_t k = std::min(V, size_t(s.req.n_top_logprobs));
        std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(),
                          [&](int32_t a, int32_t b) { return lg[size_t(a)] > lg[size_t(b)] || (lg[size_t(a)] == lg[size_t(b)] && a < b); });
        for (size_t i = 0; i < k; ++i) ev.top.push_back({idx[i], lg[size_t(idx[i])] - lse});
      }
    }
    if (s.n_generated == 0) s.ttft = now_s() - s.t_submit;
    ++s.n_generated;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.generated_tokens;
    }
    const bool eog = tok.is_eog(next);
    if (eog) {
      finish(s, FinishReason::Stop);
      return false;
    }
    if (s.req.constraint) s.req.constraint->accept(next);
    if (!s.sink(ev)) {
      finish_silent(FinishReason::Cancelled);
      return false;
    }
    if (s.req.max_tokens >= 0 && s.n_generated >= s.req.max_tokens) {
      finish(s, FinishReason::Length);
      return false;
    }
    if (s.session->n_pos() >= s.session->n_ctx()) {
      finish(s, FinishReason::Context);
      return false;
    }
    s.session->forward(&next, 1, false, s.logits, pool_);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
    return true;
  }

  void finish_silent(FinishReason reason) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requests_finished[int(reason)];
  }

  void loop() {
    for (;;) {
      std::vector<uint64_t> cancels;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || !running_.empty() || !cancelled_.empty(); });
        if (stopping_) break;
        cancels.swap(cancelled_);
        while (!queue_.empty() && int32_t(running_.size()) < opts_.n_parallel) {
          running_.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
      // Cancels may name queued requests too.
      if (!cancels.empty()) {
        std::unique_lock<std::mutex> lock(mu_);
        std::vector<std::unique_ptr<Sequence>> dropped;
        for (auto it = queue_.begin(); it != queue_.end();) {
          if (std::find(cancels.begin(), cancels.end(), (*it)->id) != cancels.end()) {
            dropped.push_back(std::move(*it));
            it = queue_.erase(it);
          } else {
            ++it;
          }
        }
        lock.unlock();
        for (auto& s : dropped) finish(*s, FinishReason::Cancelled);
        for (auto& s : running_)
          if (std::find(cancels.begin(), cancels.end(), s->id) != cancels.end()) s->cancel_requested = true;
      }
      for (size_t i = 0; i < running_.size();) {
        Sequence& s = *running_[i];
        bool keep;
        if (s.cancel_requested) {
          finish(s, FinishReason::Cancelled);
          keep = false;
        } else if (s.deadline > 0 && now_s() > s.deadline) {
          finish(s, FinishReason::Timeout);
          keep = false;
        } else {
          try {
            keep = step(s);
          } catch (const std::exception& e) {
            finish(s, FinishReason::Error, e.what());
            keep = false;
          }
        }
        if (keep) {
          ++i;
        } else {
          std::lock_guard<std::mutex> lock(mu_);
          running_.erase(running_.begin() + long(i));
        }
      }
    }
    // Shutdown: every request still here gets its final event.
    std::deque<std::unique_ptr<Sequence>> rest;
    {
      std::lock_guard<std::mutex> lock(mu_);
      rest.swap(queue_);
    }
    for (auto& s : running_) finish(*s, FinishReason::Cancelled);
    for (auto& s : rest) finish(*s, FinishReason::Cancelled);
    std::lock_guard<std::mutex> lock(mu_);
    running_.clear();
  }

  const Model& model_;
  EngineOptions opts_;
  ThreadPool pool_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> queue_;
  std::vector<std::unique_ptr<Sequence>> running_;  // touched by the scheduler thread only (size read under mu_)
  std::vector<uint64_t> cancelled_;
  EngineStats stats_;
  uint64_t next_id_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Engine> make_engine(const Model& model, const EngineOptions& options) {
  return std::make_unique<SerialEngine>(model, options);
}

}  // namespace step35
