#include "engine/generator.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "exec/clock.h"
#include "exec/thread_pool.h"
#include "model/step35.h"

namespace step35 {

namespace {

// A verification pass runs the pending token and up to kMaxDrafts drafts.
constexpr int32_t kVerifyChunk = kMaxDrafts + 1;

GeneratorOptions checked(const Model& model, GeneratorOptions o) {
  if (o.n_ctx < 1) throw std::invalid_argument("generator: context must be >= 1");
  o.n_batch = std::clamp(o.n_batch, 1, o.n_ctx);
  if (!model.has_mtp()) o.mtp = 0;
  return o;
}

}  // namespace

Generator::Generator(const Model& model, const GeneratorOptions& options)
    : model_(model),
      options_(checked(model, options)),
      kv_(KvPool::for_one_sequence(model.kv_layers(), options_.n_ctx, model.hparams().swa_window,
                                   options_.mtp > 0 ? std::max(options_.n_batch, kVerifyChunk) : options_.n_batch,
                                   options_.mtp > 0 ? kMaxDrafts : 0, options_.kv_types)) {
  if (options_.mtp > 0)
    speculation_ = std::make_unique<Speculation>(model, options_.mtp, options_.mtp_adaptive, 1, options_.n_ctx,
                                                 options_.kv_types);
  ws_.precision = options_.precision;
}

Generator::~Generator() = default;

std::string Generator::describe_kv() const { return kv_.describe(options_.n_ctx); }

void Generator::start(SequenceParams params, TokenSink sink) {
  seq_.reset();
  if (params.n_ctx <= 0 || params.n_ctx > options_.n_ctx) params.n_ctx = options_.n_ctx;
  if (int64_t(params.prompt.size()) > params.n_ctx)
    throw std::invalid_argument("the prompt is " + std::to_string(params.prompt.size()) +
                                " tokens, which does not fit the context of " + std::to_string(params.n_ctx) + " tokens");
  if (speculation_) speculation_->reset();  // nothing learned about the previous sequence carries over
  seq_ = std::make_unique<Sequence>(model_, kv_, std::move(params), std::move(sink), speculation_.get());
  if (!seq_->reserve()) throw std::logic_error("generator: the KV pool cannot hold its one sequence");
}

// One forward pass over the sequence's next chunk; its output consumed.
std::optional<FinishReason> Generator::pass(ThreadPool& pool, int32_t max_tokens) {
  chunks_.assign(1, seq_->plan(max_tokens));
  const bool decode = !seq_->prefilling();
  const int32_t drafts = seq_->step_drafts();
  const double t0 = steady_seconds();
  model_.forward(kv_, chunks_, out_, ws_, pool, ForwardOptions{options_.precision, nullptr});
  const double trunk_s = steady_seconds() - t0;
  std::optional<FinishReason> end = seq_->consume(out_, 0);
  if (decode && speculation_) speculation_->record_pass(drafts, trunk_s);
  return end;
}

std::optional<FinishReason> Generator::prefill(ThreadPool& pool) {
  std::optional<FinishReason> end;
  while (!end && seq_->prefilling()) end = pass(pool, options_.n_batch);
  return end;
}

std::optional<FinishReason> Generator::step(ThreadPool& pool) {
  if (seq_->prefilling()) return prefill(pool);
  if (speculation_) {
    drafting_.assign(1, seq_.get());
    speculation_->draft(drafting_, pool, ws_, options_.precision);
  }
  return pass(pool, std::max(options_.n_batch, kVerifyChunk));
}

FinishReason Generator::run(ThreadPool& pool) {
  std::optional<FinishReason> end = prefill(pool);
  while (!end) end = step(pool);
  return *end;
}

}  // namespace step35
