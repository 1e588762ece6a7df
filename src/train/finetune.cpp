#include "train/finetune.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>

#include "exec/clock.h"

namespace step35::train {

namespace {

// Fisher-Yates with our own bounded draw, so the order depends only on the seed (not on
// the standard library's distribution code).
void shuffle(std::vector<int64_t>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) {
    const uint64_t bound = i, limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do r = rng();
    while (r >= limit);
    std::swap(v[i - 1], v[size_t(r % bound)]);
  }
}

TrainBatch make_batch(const TokenWindows& data, const int64_t* windows, int32_t n) {
  TrainBatch b;
  b.n_seq = n;
  b.n_ctx = data.n_ctx();
  b.tokens.resize(size_t(n) * size_t(b.n_ctx));
  b.targets.resize(b.tokens.size());
  for (int32_t i = 0; i < n; ++i)
    data.fill(windows[i], b.tokens.data() + size_t(i) * size_t(b.n_ctx), b.targets.data() + size_t(i) * size_t(b.n_ctx));
  return b;
}

// The model's loss statistics over the first `limit` windows of `data` (all when limit <= 0),
// `batch` windows per forward pass.
LossStats run_windows(TrainingModel& model, const TokenWindows& data, int64_t limit, int32_t batch) {
  const int64_t n = limit > 0 ? std::min(data.size(), limit) : data.size();
  std::vector<int64_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), int64_t(0));
  LossStats total;
  for (int64_t w0 = 0; w0 < n; w0 += batch) {
    const int32_t nb = int32_t(std::min<int64_t>(batch, n - w0));
    total.add(model.run(make_batch(data, ids.data() + w0, nb)));
  }
  return total;
}

}  // namespace

TokenWindows::TokenWindows(std::vector<int32_t> tokens, int32_t n_ctx) : tokens_(std::move(tokens)), n_ctx_(n_ctx) {
  if (n_ctx < 1) throw std::invalid_argument("context size must be at least 1");
  if (int64_t(tokens_.size()) < int64_t(n_ctx) + 1)
    throw std::invalid_argument("the text has " + std::to_string(tokens_.size()) + " tokens; a window of context " +
                                std::to_string(n_ctx) + " needs " + std::to_string(int64_t(n_ctx) + 1) +
                                " (use a smaller --ctx-size or a longer text)");
  n_windows_ = (int64_t(tokens_.size()) - 1) / n_ctx;
}

void TokenWindows::fill(int64_t window, int32_t* inputs, int32_t* targets) const {
  const size_t start = size_t(window) * size_t(n_ctx_);
  for (int32_t i = 0; i < n_ctx_; ++i) {
    inputs[i] = tokens_[start + size_t(i)];
    targets[i] = tokens_[start + size_t(i) + 1];
  }
}

double activation_skew(const std::vector<int64_t>& counts) {
  if (counts.empty()) return 0.0;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  if (total == 0) return 0.0;
  const int64_t mx = *std::max_element(counts.begin(), counts.end());
  return double(mx) / (double(total) / double(counts.size()));
}

Finetuner::Finetuner(const Model& m, FinetuneSettings s, ThreadPool& pool) : m_(m), s_(std::move(s)), pool_(pool) {
  if (s_.batch < 1) throw std::invalid_argument("batch size must be at least 1");
  if (s_.steps < 0) throw std::invalid_argument("steps must not be negative");
  s_.groups.check(m_);
  if (s_.balance_groups > 0 && m_.hparams().n_expert % s_.balance_groups != 0)
    throw std::invalid_argument("--balance-groups " + std::to_string(s_.balance_groups) + " does not divide the " +
                                std::to_string(m_.hparams().n_expert) + " experts");
}

Finetuner::~Finetuner() = default;

const TrainGroups& Finetuner::groups() const { return s_.groups; }

TrainedParams& Finetuner::params() {
  if (!params_) throw std::logic_error("Finetuner: prepare() first");
  return *params_;
}

uint64_t Finetuner::activation_bytes() const { return model_ ? model_->activation_bytes() : 0; }

void Finetuner::prepare(const TokenWindows& train) {
  TrainGroups& g = s_.groups;
  if (!g.top_experts.empty()) {
    // Count the base model's selections over the training windows.
    TrainingOptions base_options;
    base_options.precision = s_.precision;
    TrainingModel base(m_, nullptr, pool_, base_options);
    const LossStats total = run_windows(base, train, s_.eval_windows, s_.batch);
    const std::vector<std::vector<int64_t>>& counts = total.expert_counts;
    std::set<TrainGroups::Expert> chosen(g.experts.begin(), g.experts.end());
    for (const TrainGroups::TopExperts& t : g.top_experts) {
      const std::vector<int64_t>& c = counts[size_t(t.layer)];
      std::vector<int32_t> order(c.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return c[size_t(a)] > c[size_t(b)]; });
      for (int32_t i = 0; i < t.n; ++i) chosen.insert({t.layer, order[size_t(i)]});
    }
    g.experts.assign(chosen.begin(), chosen.end());
    g.top_experts.clear();
  }
  params_ = std::make_unique<TrainedParams>(TrainedParams::from_model(m_, g));
  TrainingOptions o;
  o.balance_weight = s_.balance_weight;
  o.balance_groups = s_.balance_groups;
  o.precision = s_.precision;
  model_ = std::make_unique<TrainingModel>(m_, params_.get(), pool_, o);
}

Evaluation Finetuner::evaluate(const TokenWindows& data) {
  if (!model_) throw std::logic_error("Finetuner: prepare() first");
  Evaluation ev;
  ev.stats = run_windows(*model_, data, s_.eval_windows, s_.batch);
  std::set<int32_t> layers(params_->groups().routers.begin(), params_->groups().routers.end());
  for (const TrainGroups::Expert& e : params_->groups().experts) layers.insert(e.layer);
  for (int32_t il : layers)
    if (size_t(il) < ev.stats.expert_counts.size()) ev.skew[il] = activation_skew(ev.stats.expert_counts[size_t(il)]);
  return ev;
}

TrainSummary Finetuner::train(const TokenWindows& data, const std::function<void(const StepInfo&)>& on_step) {
  if (!model_) throw std::logic_error("Finetuner: prepare() first");
  TrainSummary sum;
  AdamW opt(s_.adamw);
  std::mt19937_64 rng(s_.seed);
  std::vector<int64_t> order(static_cast<size_t>(data.size()));
  std::iota(order.begin(), order.end(), int64_t(0));
  size_t next = order.size();  // reshuffle on first use
  std::vector<int64_t> picked(static_cast<size_t>(s_.batch));
  const double t0 = steady_seconds();
  for (int64_t step = 0; step < s_.steps; ++step) {
    // The next batch of windows of the shuffled order (a new order every epoch).
    for (int32_t i = 0; i < s_.batch; ++i) {
      if (next == order.size()) {
        shuffle(order, rng);
        next = 0;
      }
      picked[size_t(i)] = order[next++];
    }
    params_->zero_grad();
    const LossStats st = model_->run(make_batch(data, picked.data(), s_.batch), params_.get());
    StepInfo info;
    info.lr = opt.lr_at(step);
    info.grad_norm = opt.step(*params_);
    info.step = step + 1;
    info.steps = s_.steps;
    info.loss = st.loss();
    sum.tokens += int64_t(s_.batch) * data.n_ctx();
    info.elapsed_s = steady_seconds() - t0;
    info.tokens_per_s = info.elapsed_s > 0 ? double(sum.tokens) / info.elapsed_s : 0.0;
    sum.losses.push_back(info.loss);
    if (on_step) on_step(info);
  }
  sum.steps = s_.steps;
  sum.seconds = steady_seconds() - t0;
  sum.tokens_per_s = sum.seconds > 0 ? double(sum.tokens) / sum.seconds : 0.0;
  return sum;
}

}  // namespace step35::train
