#include "server/generation.h"

#include <algorithm>

#include "chat/step35_format.h"

namespace step35::server {

void EventQueue::push(ChoiceEvent ev) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    events_.push_back(std::move(ev));
  }
  cv_.notify_one();
}

bool EventQueue::pop(ChoiceEvent& out, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_until(lk, deadline, [&] { return !events_.empty(); })) return false;
  out = std::move(events_.front());
  events_.pop_front();
  return true;
}

bool EventQueue::peek(ChoiceEvent& out, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_until(lk, deadline, [&] { return !events_.empty(); })) return false;
  out = events_.front();
  return true;
}

GenerationRun::GenerationRun(Engine& engine, std::vector<GenerateRequest> requests, std::vector<ChoiceText> texts)
    : engine_(engine), state_(std::make_shared<State>()) {
  state_->texts = std::move(texts);
  try {
    for (size_t i = 0; i < requests.size(); ++i) {
      std::shared_ptr<State> st = state_;
      const int index = int(i);
      // Runs on the scheduler thread. The text is this choice's alone until its final
      // event is queued; the queue's mutex hands it to the HTTP thread with that event.
      const uint64_t id = engine_.submit(std::move(requests[i]), [st, index](const GenerateEvent& ev) {
        ChoiceText& text = st->texts[size_t(index)];
        ChoiceEvent ce{index, ev, ev.done ? text.finish() : text.push(ev.token)};
        const bool complete = ce.delta.complete;
        st->queue.push(std::move(ce));
        return complete ? SinkReply::Stop : SinkReply::Continue;
      });
      ids_.push_back(id);
      done_.push_back(false);
    }
  } catch (...) {
    cancel_all();
    throw;
  }
}

GenerationRun::~GenerationRun() { cancel_all(); }

size_t GenerationRun::running() const {
  size_t n = 0;
  for (bool d : done_) n += !d;
  return n;
}

void GenerationRun::cancel_all() {
  for (size_t i = 0; i < ids_.size(); ++i)
    if (!done_[i]) engine_.cancel(ids_[i]);
}

ChoiceText::ChoiceText(const Tokenizer& tok, ChoiceTextOptions options) : tok_(tok), options_(std::move(options)) {
  if (options_.parse) parser_ = std::make_unique<OutputParser>(tok, options_.tools, options_.parser);
}

void ChoiceText::take(std::vector<OutputDelta> deltas, TextDelta& d) {
  for (OutputDelta& o : deltas) {
    switch (o.kind) {
      case OutputDelta::Kind::Reasoning:
        d.reasoning += o.text;
        reasoning_ += o.text;
        break;
      case OutputDelta::Kind::Content: held_ += o.text; break;
      default: d.tool_calls.push_back(std::move(o)); break;
    }
  }
}

TextDelta ChoiceText::push(int32_t token) {
  TextDelta d;
  if (stopped_) return d;
  if (parser_) {
    if (!tok_.is_eog(token)) raw_ += tok_.token_to_piece(token, true);
    take(parser_->push(token), d);
    // parallel_tool_calls: false: the first call that closes ends the output.
    if (options_.single_tool_call && !parser_->result().tool_calls.empty() && !parser_->in_tool_call())
      d.complete = true;
  } else {
    if (tok_.is_eog(token)) return d;
    held_ += utf8_.push(tok_.token_to_piece(token, false));
  }
  emit_content(d, false);
  if (d.stop_matched) d.complete = true;
  return d;
}

TextDelta ChoiceText::finish() {
  TextDelta d;
  if (stopped_) return d;
  if (parser_) {
    take(parser_->finish(), d);
  } else {
    held_ += utf8_.flush();
  }
  emit_content(d, true);
  return d;
}

std::vector<ParsedToolCall> ChoiceText::tool_calls() const {
  return parser_ ? parser_->result().tool_calls : std::vector<ParsedToolCall>{};
}

bool ChoiceText::truncated_call() const { return parser_ && parser_->result().truncated; }

std::string ChoiceText::text_after_reasoning() const {
  if (!parser_) return content_;
  if (!options_.parser.in_reasoning) return raw_;
  // Reasoning ends at the first </think>, or at the first <tool_call> (with tools).
  const size_t think_end = raw_.find(step35_format::kThinkClose);
  const size_t call = options_.tools.is_array() && !options_.tools.empty() ? raw_.find(step35_format::kToolCallOpen)
                                                                           : std::string::npos;
  if (call < think_end) return raw_.substr(call);
  if (think_end == std::string::npos) return "";
  size_t from = think_end + step35_format::kThinkClose.size();
  if (from < raw_.size() && raw_[from] == '\n') ++from;
  return raw_.substr(from);
}

void ChoiceText::emit_content(TextDelta& d, bool final) {
  // The earliest stop string in the content not yet emitted (a stop string cannot start
  // in text already emitted: that text was held back while it could).
  size_t cut = std::string::npos;
  for (const std::string& s : options_.stops) {
    const size_t at = held_.find(s);
    if (at < cut) {
      cut = at;
      matched_stop_ = s;
    }
  }
  if (cut != std::string::npos) {
    d.content = held_.substr(0, cut);
    content_ += d.content;
    held_.clear();
    d.stop_matched = stopped_ = true;
    return;
  }
  size_t keep = 0;  // the longest suffix of held_ that begins some stop string
  if (!final)
    for (const std::string& s : options_.stops)
      for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
        if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
          keep = n;
          break;
        }
  d.content = held_.substr(0, held_.size() - keep);
  content_ += d.content;
  held_.erase(0, held_.size() - keep);
}

DriveEnd drive(GenerationRun& run, std::chrono::steady_clock::time_point deadline, const TokenCallback& on_token,
               const DoneCallback& on_done, const std::function<bool()>& client_gone) {
  using Clock = std::chrono::steady_clock;
  size_t remaining = run.running();
  ChoiceEvent ce;
  constexpr auto kClientCheck = std::chrono::milliseconds(100);
  auto next_check = Clock::now() + kClientCheck;
  while (remaining > 0) {
    // Whether events keep coming or not, the client is looked at every 100 ms.
    if (client_gone && Clock::now() >= next_check) {
      if (client_gone()) return DriveEnd::Abandoned;
      next_check = Clock::now() + kClientCheck;
    }
    if (!run.next(ce, client_gone ? std::min(deadline, next_check) : deadline)) {
      if (Clock::now() >= deadline) return DriveEnd::Deadline;
      continue;
    }
    if (!ce.event.done) {
      if (!on_token(ce.index, ce.event, ce.delta)) return DriveEnd::Abandoned;
      continue;
    }
    run.mark_done(ce.index);
    --remaining;
    if (!on_done(ce.index, ce.event, ce.delta)) return DriveEnd::Abandoned;
  }
  return DriveEnd::Finished;
}

std::vector<GenerateRequest> replicate(const GenerateRequest& request, int n) {
  std::vector<GenerateRequest> out;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r = request;
    r.sampling.seed = request.sampling.seed + uint64_t(i);
    if (request.constraint && i > 0) r.constraint = std::shared_ptr<TokenConstraint>(request.constraint->clone());
    out.push_back(std::move(r));
  }
  return out;
}

const char* openai_finish_reason(const GenerateEvent& ev, const ChoiceText& text) {
  if (text.stopped()) return "stop";
  switch (ev.reason) {
    case FinishReason::Stop: return text.tool_calls().empty() ? "stop" : "tool_calls";
    case FinishReason::Length:
    case FinishReason::Context:
    case FinishReason::Timeout: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "stop";
}

}  // namespace step35::server
