#include "server/generation.h"

namespace step35::server {

void EventQueue::push(int index, const GenerateEvent& ev) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    events_.push_back({index, ev});
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

GenerationRun::GenerationRun(Engine& engine, std::vector<GenerateRequest> requests)
    : engine_(engine), queue_(std::make_shared<EventQueue>()) {
  try {
    for (size_t i = 0; i < requests.size(); ++i) {
      std::shared_ptr<EventQueue> q = queue_;
      const int index = int(i);
      // The sink only queues: it never refuses an event, because a refused request gets
      // no final event. Stopping goes through Engine::cancel(), which always ends with one
      // (token events already on their way are skipped by drive()).
      const uint64_t id = engine_.submit(std::move(requests[i]), [q, index](const GenerateEvent& ev) {
        q->push(index, ev);
        return SinkReply::Continue;
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

void GenerationRun::stop(int index) { engine_.cancel(ids_[size_t(index)]); }

void GenerationRun::cancel_all() {
  for (size_t i = 0; i < ids_.size(); ++i)
    if (!done_[i]) engine_.cancel(ids_[i]);
}

ChoiceText::ChoiceText(const Tokenizer& tok, std::vector<std::string> stops) : tok_(tok), stops_(std::move(stops)) {}

ChoiceText::ChoiceText(const Tokenizer& tok, std::vector<std::string> stops, const nlohmann::json& tools,
                       const OutputParserOptions& parser_options)
    : tok_(tok), parser_(std::make_unique<OutputParser>(tok, tools, parser_options)), stops_(std::move(stops)) {}

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
    take(parser_->push(token), d);
  } else {
    if (tok_.is_eog(token)) return d;
    held_ += utf8_.push(tok_.token_to_piece(token, false));
  }
  emit_content(d, false);
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

void ChoiceText::emit_content(TextDelta& d, bool final) {
  // The earliest stop string in the content not yet emitted (a stop string cannot start
  // in text already emitted: that text was held back while it could).
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) {
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
    for (const std::string& s : stops_)
      for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
        if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
          keep = n;
          break;
        }
  d.content = held_.substr(0, held_.size() - keep);
  content_ += d.content;
  held_.erase(0, held_.size() - keep);
}

}  // namespace step35::server

namespace step35::server {

bool drive(GenerationRun& run, std::vector<ChoiceText>& texts, std::chrono::steady_clock::time_point deadline,
           const TokenCallback& on_token, const DoneCallback& on_done) {
  size_t remaining = run.running();
  ChoiceEvent ce;
  while (remaining > 0) {
    if (!run.next(ce, deadline)) return false;
    ChoiceText& text = texts[size_t(ce.index)];
    if (!ce.event.done) {
      if (text.stopped()) continue;  // events already queued when a stop string matched
      const TextDelta d = text.push(ce.event.token);
      if (!on_token(ce.index, ce.event, d)) return false;
      if (d.stop_matched) run.stop(ce.index);
      continue;
    }
    run.mark_done(ce.index);
    --remaining;
    const TextDelta d = text.finish();
    if (!on_done(ce.index, ce.event, d)) return false;
  }
  return true;
}

}  // namespace step35::server

namespace step35::server {

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

const char* openai_finish_reason(const GenerateEvent& ev, bool stop_string_matched) {
  if (stop_string_matched) return "stop";
  switch (ev.reason) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length:
    case FinishReason::Context:
    case FinishReason::Timeout: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "stop";
}

}  // namespace step35::server
