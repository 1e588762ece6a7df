// One HTTP request's generations in the engine: submits its n choices, receives their
// events through a queue (the engine's sinks only push and return, so the scheduler
// thread never waits on HTTP I/O), and turns each choice's tokens into text deltas
// (reasoning / content split at the think end, stop strings, logprobs).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "chat/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace step35::server {

struct ChoiceEvent {
  int index = 0;
  GenerateEvent event;
};

// Events of all choices of one request, in arrival order.
class EventQueue {
 public:
  void push(int index, const GenerateEvent& ev);
  // Waits until an event arrives or `deadline` passes (false).
  bool pop(ChoiceEvent& out, std::chrono::steady_clock::time_point deadline);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ChoiceEvent> events_;
};

// The engine requests of one HTTP request. Destroying it cancels every choice still
// running (the queue outlives it in the sinks, so late events are harmless).
class GenerationRun {
 public:
  // Submits every request (choice i = requests[i]); QueueFullError / RequestError pass
  // through after cancelling the ones already submitted.
  GenerationRun(Engine& engine, std::vector<GenerateRequest> requests);
  ~GenerationRun();
  GenerationRun(const GenerationRun&) = delete;
  GenerationRun& operator=(const GenerationRun&) = delete;

  bool next(ChoiceEvent& out, std::chrono::steady_clock::time_point deadline) { return queue_->pop(out, deadline); }
  // Stops one choice (a stop string matched); its final event still arrives.
  void stop(int index);
  void cancel_all();
  size_t size() const { return ids_.size(); }
  size_t running() const;  // choices whose final event has not arrived
  // The choice's final event arrived: nothing left to cancel.
  void mark_done(int index) { done_[size_t(index)] = true; }

 private:
  Engine& engine_;
  std::shared_ptr<EventQueue> queue_;
  std::vector<uint64_t> ids_;
  std::vector<bool> done_;
};

// What one token added to a choice's text.
struct TextDelta {
  std::string reasoning;
  std::string content;
  std::vector<OutputDelta> tool_calls;  // ToolCallStart / ToolCallArguments deltas
  bool stop_matched = false;  // a stop string ended the content (it is not included)
};

// Text assembly of one choice. Chat output goes through the OutputParser (reasoning /
// content / tool calls); raw output (completions) is the token pieces as they are. Either
// way stop strings end the content (text that may still become a stop string is held
// back).
class ChoiceText {
 public:
  // Raw text (no parsing).
  ChoiceText(const Tokenizer& tok, std::vector<std::string> stops);
  // Parsed chat output.
  ChoiceText(const Tokenizer& tok, std::vector<std::string> stops, const nlohmann::json& tools,
             const OutputParserOptions& parser_options);
  TextDelta push(int32_t token);
  TextDelta finish();  // flushes what was held back (at the end of the choice)
  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }
  bool stopped() const { return stopped_; }
  const std::string& matched_stop() const { return matched_stop_; }  // the stop string that ended it
  // The parsed tool calls (complete after finish()); empty for raw text.
  std::vector<ParsedToolCall> tool_calls() const;

 private:
  void take(std::vector<OutputDelta> deltas, TextDelta& d);
  void emit_content(TextDelta& d, bool final);
  const Tokenizer& tok_;
  std::unique_ptr<OutputParser> parser_;  // null: raw text
  std::vector<std::string> stops_;
  Utf8Stream utf8_;
  std::string reasoning_, content_;  // emitted so far
  std::string held_;                 // content not yet emitted
  bool stopped_ = false;
  std::string matched_stop_;
};

// n copies of `request` for n choices: choice i samples with seed + i and its own copy
// of the constraint.
std::vector<GenerateRequest> replicate(const GenerateRequest& request, int n);

// OpenAI's finish_reason for a choice's final event.
const char* openai_finish_reason(const GenerateEvent& final_event, bool stop_string_matched);

// Delivers a run's events until every choice has ended: each token event with the text
// it added (`on_token`), then each choice's final event with the text held back until
// then (`on_done`). A matched stop string stops that choice. Returns false when
// `deadline` passes or a callback returns false (the client went away); the caller then
// drops the run, which cancels what is left.
using TokenCallback = std::function<bool(int index, const GenerateEvent& token_event, const TextDelta& delta)>;
using DoneCallback = std::function<bool(int index, const GenerateEvent& final_event, const TextDelta& delta)>;
bool drive(GenerationRun& run, std::vector<ChoiceText>& texts, std::chrono::steady_clock::time_point deadline,
           const TokenCallback& on_token, const DoneCallback& on_done);

}  // namespace step35::server
