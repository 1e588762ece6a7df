// What the generation endpoints (chat completions, completions, messages, responses)
// share: one HTTP request's choices in the engine with their text and deadline, answered
// either whole (collect) or as an event stream (stream), with the same protocol for all:
// a request that fails before its first token still gets its HTTP status, events go out
// as they come, and whatever is left is cancelled when the client goes away or the
// deadline passes.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/generation.h"
#include "server/server_context.h"

namespace step35::server {

class EventWriter;

// Token counts over a request's choices, as OpenAI's usage object reports them.
struct Usage {
  int32_t prompt = 0;
  int32_t cached = 0;      // the most any choice reused from the prefix cache
  int64_t completion = 0;  // summed over the choices
  void add(const GenerateEvent& final_event) {
    prompt = final_event.n_prompt;
    cached = std::max(cached, final_event.n_cached);
    completion += final_event.n_generated;
  }
  nlohmann::json openai() const;
};

// The ApiError a choice's final event stands for (408 timeout, 500 generation error), for
// a response that has not started; nothing for any other final event.
void throw_if_failed(const GenerateEvent& final_event);

// Thrown by Generation::collect when the client of a non-streamed request has gone: its
// choices are cancelled, and the endpoint answers nobody (the access log says 499).
struct ClientGone {};

class Generation {
 public:
  // Submits `n` choices of `request` (replicate()); texts[i] assembles choice i's text, in
  // the engine's sink (generation.h). QueueFullError / RequestError pass through (nothing
  // stays submitted). The exchange's access line gets the prompt's size.
  Generation(ServerContext& ctx, HttpExchange& ex, const GenerateRequest& request, int n, std::vector<ChoiceText> texts);

  // The whole answer: runs every choice to its end, `on_token` seeing each token event
  // with the text it added, and returns the final events in choice order (recorded in the
  // metrics and the access line). Throws ApiError 408 when the deadline passes, a failed
  // choice's error, or ClientGone when the client leaves first (checked every 100 ms).
  std::vector<GenerateEvent> collect(HttpExchange& ex, const TokenCallback& on_token);

  // Choice i's text: complete once its final event was delivered (after collect(), or in
  // EventWriter::done()).
  const ChoiceText& text(int choice) const { return run_.text(choice); }
  size_t size() const { return run_.size(); }

 private:
  friend void stream(std::shared_ptr<Generation> gen, HttpExchange& ex, std::shared_ptr<EventWriter> writer);

  ServerContext& ctx_;
  GenerationRun run_;
  std::chrono::steady_clock::time_point deadline_;
};

// How one endpoint writes its event stream. Every call returns false when the client has
// gone (the rest is then cancelled).
class EventWriter {
 public:
  virtual ~EventWriter() = default;
  virtual bool begin(httplib::DataSink&) { return true; }  // before the first event
  virtual bool token(httplib::DataSink& sink, int choice, const GenerateEvent& event, const TextDelta& delta) = 0;
  // A choice's final event (already recorded in the metrics), with its last text.
  virtual bool done(httplib::DataSink& sink, int choice, const GenerateEvent& event, const TextDelta& delta,
                    const ChoiceText& text) = 0;
  virtual bool end(httplib::DataSink&) { return true; }  // after every choice ended
};

// The writer of a single-choice stream that ends with a summary of its final event
// (Anthropic messages, OpenAI responses): every delta, the last one included, goes to
// emit(), and done() keeps the final event and the text for end().
class FinalEventWriter : public EventWriter {
 public:
  bool token(httplib::DataSink& sink, int, const GenerateEvent&, const TextDelta& d) override { return emit(sink, d); }
  bool done(httplib::DataSink& sink, int, const GenerateEvent& ev, const TextDelta& d, const ChoiceText& t) override {
    final_ = ev;
    text_ = &t;
    return emit(sink, d);
  }

 protected:
  virtual bool emit(httplib::DataSink& sink, const TextDelta& d) = 0;

  GenerateEvent final_;
  const ChoiceText* text_ = nullptr;  // set with final_
};

// Streams `gen` as the body of the exchange's response through `writer`. Waits for the
// first event before answering, so that a request failing before its first token (a
// timeout in the queue, an engine error) gets its HTTP status: throws ApiError then
// (408 / 500).
void stream(std::shared_ptr<Generation> gen, HttpExchange& ex, std::shared_ptr<EventWriter> writer);

}  // namespace step35::server
