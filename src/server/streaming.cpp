#include "server/streaming.h"

#include "server/api_error.h"

namespace step35::server {

nlohmann::json Usage::openai() const {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

void throw_if_failed(const GenerateEvent& ev) {
  if (ev.reason == FinishReason::Timeout) throw ApiError(408, "the request timed out");
  if (ev.reason == FinishReason::Error) throw ApiError(500, "generation failed: " + ev.error);
}

Generation::Generation(ServerContext& ctx, const GenerateRequest& request, int n, std::vector<ChoiceText> texts)
    : ctx_(ctx),
      run_(*ctx.engine, replicate(request, n)),
      texts_(std::move(texts)),
      deadline_(std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                        std::chrono::duration<double>(ctx.options.timeout_s + 5))) {}

std::vector<GenerateEvent> Generation::collect(const TokenCallback& on_token) {
  std::vector<GenerateEvent> finals(texts_.size());
  const bool ok = drive(run_, texts_, deadline_, on_token, [&](int i, const GenerateEvent& ev, const TextDelta&) {
    finals[size_t(i)] = ev;
    ctx_.metrics.observe_generation(ev);
    return true;
  });
  if (!ok) throw ApiError(408, "the request timed out");
  for (const GenerateEvent& ev : finals) throw_if_failed(ev);
  return finals;
}

void stream(std::shared_ptr<Generation> gen, httplib::Response& res, std::shared_ptr<EventWriter> writer) {
  auto first = std::make_shared<ChoiceEvent>();
  if (!gen->run_.next(*first, gen->deadline_)) throw ApiError(408, "the request timed out");
  if (first->event.done) throw_if_failed(first->event);
  set_event_stream(gen->ctx_, res, [gen, writer, first](httplib::DataSink& sink) {
    auto on_token = [&](int i, const GenerateEvent& ev, const TextDelta& d) { return writer->token(sink, i, ev, d); };
    auto on_done = [&](int i, const GenerateEvent& ev, const TextDelta& d) {
      gen->ctx_.metrics.observe_generation(ev);
      return writer->done(sink, i, ev, d, gen->text(i));
    };
    bool ok = writer->begin(sink);
    // The first event was taken off the queue already: it goes through the same path.
    if (ok) ok = deliver(gen->run_, gen->texts_, *first, on_token, on_done);
    if (ok) ok = drive(gen->run_, gen->texts_, gen->deadline_, on_token, on_done);
    if (ok) ok = writer->end(sink);
    if (!ok) gen->run_.cancel_all();
    sink.done();
  });
}

}  // namespace step35::server
