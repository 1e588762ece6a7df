#include "server/streaming.h"

#include "server/api_error.h"
#include "server/client_connection.h"
#include "server/endpoint.h"

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

Generation::Generation(ServerContext& ctx, HttpExchange& ex, const GenerateRequest& request, int n,
                       std::vector<ChoiceText> texts)
    : ctx_(ctx), run_(*ctx.engine, replicate(request, n), std::move(texts)), deadline_(generation_deadline(ctx)) {
  ex.trace->prompt_tokens = int64_t(request.prompt.size());
}

std::vector<GenerateEvent> Generation::collect(HttpExchange& ex, const TokenCallback& on_token) {
  std::vector<GenerateEvent> finals(run_.size());
  const ClientConnection client(ex.req);
  const DriveEnd end = drive(
      run_, deadline_, on_token,
      [&](int i, const GenerateEvent& ev, const TextDelta&) {
        finals[size_t(i)] = ev;
        ctx_.metrics.observe_generation(ev);
        ex.trace->completion_tokens += ev.n_generated;
        return true;
      },
      [&client] { return client.gone(); });
  if (end == DriveEnd::Abandoned) throw ClientGone{};
  if (end == DriveEnd::Deadline) throw ApiError(408, "the request timed out");
  for (const GenerateEvent& ev : finals) throw_if_failed(ev);
  return finals;
}

void stream(std::shared_ptr<Generation> gen, HttpExchange& ex, std::shared_ptr<EventWriter> writer) {
  // The first event is looked at, not taken: drive() delivers it like the others.
  ChoiceEvent first;
  if (!gen->run_.peek(first, gen->deadline_)) throw ApiError(408, "the request timed out");
  if (first.event.done) throw_if_failed(first.event);
  std::shared_ptr<RequestTrace> trace = ex.trace;
  set_event_stream(gen->ctx_, ex, [gen, writer, trace](httplib::DataSink& sink) {
    auto on_token = [&](int i, const GenerateEvent& ev, const TextDelta& d) { return writer->token(sink, i, ev, d); };
    auto on_done = [&](int i, const GenerateEvent& ev, const TextDelta& d) {
      gen->ctx_.metrics.observe_generation(ev);
      trace->completion_tokens += ev.n_generated;
      return writer->done(sink, i, ev, d, gen->text(i));
    };
    bool ok = writer->begin(sink);
    if (ok) ok = drive(gen->run_, gen->deadline_, on_token, on_done) == DriveEnd::Finished;
    if (ok) ok = writer->end(sink);
    if (!ok) gen->run_.cancel_all();
    sink.done();
  });
}

}  // namespace step35::server
