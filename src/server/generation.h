// One HTTP request's generations in the engine: submits its n choices and delivers their
// events, each with the text it added, through a queue to the HTTP thread.
//
// Each choice's text is assembled in its engine sink, on the scheduler thread, as the
// tokens come (reasoning / content / tool calls, stop strings): a few microseconds of
// string work, never I/O. That is what lets a stop string end the generation at the very
// token that completed it (the sink answers SinkReply::Stop), instead of after the HTTP
// thread has caught up. The HTTP thread only pops events and writes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "chat/output_parser.h"
#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace step35::server {

// What one token added to a choice's text.
struct TextDelta {
  std::string reasoning;
  std::string content;
  std::vector<OutputDelta> tool_calls;  // ToolCallStart / ToolCallArguments deltas
  bool stop_matched = false;  // a stop string ended the content (it is not included)
  // The output is complete before the end of generation (a stop string, or the one tool
  // call allowed has closed): the engine stops the choice at this token.
  bool complete = false;
};

// How a choice's text is assembled.
struct ChoiceTextOptions {
  std::vector<std::string> stops;  // stop strings (OpenAI stop, Anthropic stop_sequences)
  bool parse = false;              // chat output: reasoning / content / tool calls
  nlohmann::json tools;            // declared tools (parse only; null: calls are text)
  OutputParserOptions parser;
  bool single_tool_call = false;   // parallel_tool_calls: false: end after the first call
};

// Text assembly of one choice. Chat output goes through the OutputParser; raw output
// (completions) is the token pieces as they are. Either way stop strings end the content
// (text that may still become a stop string is held back).
class ChoiceText {
 public:
  ChoiceText(const Tokenizer& tok, ChoiceTextOptions options);
  TextDelta push(int32_t token);
  TextDelta finish();  // flushes what was held back (at the end of the choice)
  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }
  bool stopped() const { return stopped_; }
  const std::string& matched_stop() const { return matched_stop_; }  // the stop string that ended it
  // The parsed tool calls (complete after finish()); empty for raw text.
  std::vector<ParsedToolCall> tool_calls() const;
  // Generation ended inside a tool call (max_tokens, the context): that call is not a call.
  bool truncated_call() const;
  // The output after the reasoning exactly as generated (tags included): what a response
  // shows as text in place of a truncated call.
  std::string text_after_reasoning() const;

 private:
  void take(std::vector<OutputDelta> deltas, TextDelta& d);
  void emit_content(TextDelta& d, bool final);
  const Tokenizer& tok_;
  ChoiceTextOptions options_;
  std::unique_ptr<OutputParser> parser_;  // null: raw text
  Utf8Stream utf8_;
  std::string raw_;                  // every generated piece (parsed output only)
  std::string reasoning_, content_;  // emitted so far
  std::string held_;                 // content not yet emitted
  bool stopped_ = false;
  std::string matched_stop_;
};

struct ChoiceEvent {
  int index = 0;
  GenerateEvent event;
  TextDelta delta;  // what the token added (the final event: what was held back)
};

// Events of all choices of one request, in arrival order.
class EventQueue {
 public:
  void push(ChoiceEvent ev);
  // Waits until an event arrives or `deadline` passes (false).
  bool pop(ChoiceEvent& out, std::chrono::steady_clock::time_point deadline);
  // Waits likewise, but leaves the event in the queue (a copy in `out`).
  bool peek(ChoiceEvent& out, std::chrono::steady_clock::time_point deadline);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ChoiceEvent> events_;
};

// The engine requests of one HTTP request. Destroying it cancels every choice still
// running (the queue and texts outlive it in the sinks, so late events are harmless).
class GenerationRun {
 public:
  // Submits choice i = requests[i] with texts[i] assembling its text; QueueFullError /
  // RequestError pass through after cancelling the ones already submitted.
  GenerationRun(Engine& engine, std::vector<GenerateRequest> requests, std::vector<ChoiceText> texts);
  ~GenerationRun();
  GenerationRun(const GenerationRun&) = delete;
  GenerationRun& operator=(const GenerationRun&) = delete;

  bool next(ChoiceEvent& out, std::chrono::steady_clock::time_point deadline) { return state_->queue.pop(out, deadline); }
  bool peek(ChoiceEvent& out, std::chrono::steady_clock::time_point deadline) { return state_->queue.peek(out, deadline); }
  void cancel_all();
  size_t size() const { return ids_.size(); }
  size_t running() const;  // choices whose final event has not been taken
  // The choice's final event was taken: nothing left to cancel, and its text is the HTTP
  // thread's to read.
  void mark_done(int index) { done_[size_t(index)] = true; }
  // Choice i's text; read it only once its final event was taken (mark_done).
  const ChoiceText& text(int index) const { return state_->texts[size_t(index)]; }

 private:
  struct State {
    EventQueue queue;
    std::vector<ChoiceText> texts;
  };
  Engine& engine_;
  std::shared_ptr<State> state_;
  std::vector<uint64_t> ids_;
  std::vector<bool> done_;
};

// n copies of `request` for n choices: choice i samples with seed + i and its own copy
// of the constraint.
std::vector<GenerateRequest> replicate(const GenerateRequest& request, int n);

// OpenAI's finish_reason for a choice's final event: a tool call cut by max_tokens or the
// context is "length" (it comes back as text), calls that closed are "tool_calls".
const char* openai_finish_reason(const GenerateEvent& final_event, const ChoiceText& text);

// Why drive() returned.
enum class DriveEnd {
  Finished,  // every choice ended
  Deadline,  // the deadline passed first
  Abandoned, // a callback returned false, or the client went away (`client_gone`)
};

// Delivers a run's events until every choice has ended: each token event with the text
// it added (`on_token`), then each choice's final event with the text held back until
// then (`on_done`). While it waits, `client_gone` (optional) is asked about every 100 ms.
// On any end but Finished the caller drops the run, which cancels what is left.
using TokenCallback = std::function<bool(int index, const GenerateEvent& token_event, const TextDelta& delta)>;
using DoneCallback = std::function<bool(int index, const GenerateEvent& final_event, const TextDelta& delta)>;
DriveEnd drive(GenerationRun& run, std::chrono::steady_clock::time_point deadline, const TokenCallback& on_token,
               const DoneCallback& on_done, const std::function<bool()>& client_gone = nullptr);

}  // namespace step35::server
