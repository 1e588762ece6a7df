#include "chat/output_parser.h"

#include <algorithm>
#include <array>
#include <span>

#include "chat/step35_format.h"
#include "chat/stop_strings.h"
#include "chat/tool_calls.h"
#include "structured/json_schema.h"

namespace step35 {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

using namespace step35_format;

// Function and parameter names longer than this end where they are (the rest of the tag
// is skipped as stray text): a model looping inside a tag cannot grow a name unboundedly.
constexpr size_t kMaxNameBytes = 256;
// Past this many warnings further ones are counted in the last entry only.
constexpr size_t kMaxWarnings = 16;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string dump_json(const ordered_json& v) { return v.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

// Which of `tags` `buf` starts with: its index; -1 when none can (the text is stray);
// -2 when `buf` is a proper prefix of one of them (more text decides; at_end: stray).
int match_tag(std::string_view buf, std::span<const std::string_view> tags, bool at_end) {
  int i = 0;
  bool partial = false;
  for (std::string_view t : tags) {
    if (buf.substr(0, t.size()) == t) return i;
    if (buf.size() < t.size() && t.substr(0, buf.size()) == buf) partial = true;
    ++i;
  }
  return partial && !at_end ? -2 : -1;
}

}  // namespace

OutputParser::OutputParser(const Tokenizer& tok, const nlohmann::json& tools, OutputParserOptions options)
    : tok_(&tok), options_(std::move(options)), tool_params_(json::object()),
      mode_(options_.in_reasoning ? Mode::Reasoning : Mode::Content) {
  if (!tools.is_array()) return;
  for (const json& entry : tools) {
    if (!entry.is_object()) continue;
    const json* fn = &entry;
    if (entry.contains("function") && entry["function"].is_object()) fn = &entry["function"];
    if (!fn->contains("name") || !(*fn)["name"].is_string()) continue;
    const json params = fn->contains("parameters") ? (*fn)["parameters"] : json::object();
    tool_params_[(*fn)["name"].get<std::string>()] = params;
    tools_enabled_ = true;
  }
}

std::vector<OutputDelta> OutputParser::push(TokenId token) {
  if (finished_) return {};
  const std::string piece = tok_->token_to_piece(token, true);  // throws for a bad id
  if (tok_->is_eog(token)) return finish();
  const TokenType type = tok_->token_type(token);
  if (type == TokenType::CONTROL || type == TokenType::UNKNOWN) {
    // Control tokens carry no text, except the tags this parser reads.
    static const std::string_view kTags[] = {kThinkOpen, kThinkClose, kToolCallOpen, kToolCallClose};
    if (std::find(std::begin(kTags), std::end(kTags), piece) == std::end(kTags)) return {};
  }
  return push_text(piece);
}

std::vector<OutputDelta> OutputParser::push_text(std::string_view text) {
  std::vector<OutputDelta> out;
  if (finished_) return out;
  buf_ += utf8_.push(text);
  consume(out, false);
  return out;
}

std::vector<OutputDelta> OutputParser::finish() {
  std::vector<OutputDelta> out;
  if (finished_) return out;
  buf_ += utf8_.flush();
  consume(out, true);
  if (mode_ == Mode::ToolCall) {
    out_.truncated = true;
    if (call_state_ == CallState::ParameterValue) {
      warn("generation ended inside the value of parameter '" + param_name_ + "'");
      if (value_streamed_) {
        stream_value(out, "", true);
      } else {
        finish_parameter(out, call_text_);
      }
    } else if (call_state_ == CallState::ParameterName) {
      warn("generation ended inside a parameter name");
    }
    if (call_started_) warn("generation ended inside tool call " + std::to_string(out_.tool_calls.size() - 1));
    close_call(out);
  }
  if (!held_space_.empty() && out_.tool_calls.empty()) emit_text(out, OutputDelta::Kind::Content, held_space_);
  held_space_.clear();
  finished_ = true;
  return out;
}

void OutputParser::consume(std::vector<OutputDelta>& out, bool at_end) {
  for (;;) {
    bool progressed = false;
    switch (mode_) {
      case Mode::Reasoning: progressed = step_reasoning(out, at_end); break;
      case Mode::Content: progressed = step_content(out, at_end); break;
      case Mode::ToolCall: progressed = step_call(out, at_end); break;
    }
    if (!progressed) return;
  }
}

bool OutputParser::step_reasoning(std::vector<OutputDelta>& out, bool at_end) {
  if (skip_newline_) {
    if (buf_.empty()) return false;
    if (buf_[0] == '\n') buf_.erase(0, 1);
    skip_newline_ = false;
  }
  std::vector<std::string> tags = {std::string(kThinkClose), std::string(kThinkOpen)};
  if (tools_enabled_) tags.emplace_back(kToolCallOpen);
  const MarkerMatch m = find_first_marker(buf_, tags);
  if (m.pos == std::string::npos) {
    size_t keep = 0;
    if (!at_end) {
      // A newline right before </think> (or <tool_call>) is dropped: hold it too.
      std::vector<std::string> held = tags;
      for (const std::string& t : tags) held.push_back("\n" + t);
      keep = partial_marker_suffix(buf_, held);
    }
    emit_text(out, OutputDelta::Kind::Reasoning, std::string_view(buf_).substr(0, buf_.size() - keep));
    buf_.erase(0, buf_.size() - keep);
    return false;
  }
  std::string_view text = std::string_view(buf_).substr(0, m.pos);
  const std::string& tag = tags[m.marker];
  if (tag != kThinkOpen && !text.empty() && text.back() == '\n') text.remove_suffix(1);
  emit_text(out, OutputDelta::Kind::Reasoning, text);
  buf_.erase(0, m.pos + tag.size());
  if (tag == kThinkClose) {
    mode_ = Mode::Content;
    skip_newline_ = true;
  } else if (tag == kThinkOpen) {
    skip_newline_ = true;  // a repeated opening tag: dropped
  } else {
    mode_ = Mode::ToolCall;
    call_state_ = CallState::ExpectFunction;
  }
  return true;
}

bool OutputParser::step_content(std::vector<OutputDelta>& out, bool at_end) {
  if (skip_newline_) {
    if (buf_.empty()) return false;
    if (buf_[0] == '\n') buf_.erase(0, 1);
    skip_newline_ = false;
  }
  if (after_call_) {
    size_t n = 0;
    while (n < buf_.size() && is_space(buf_[n])) ++n;
    buf_.erase(0, n);
    if (buf_.empty()) return false;
    after_call_ = false;
  }
  std::vector<std::string> tags = {std::string(kThinkOpen), std::string(kThinkClose)};
  if (tools_enabled_) tags.emplace_back(kToolCallOpen);
  const MarkerMatch m = find_first_marker(buf_, tags);
  if (m.pos == std::string::npos) {
    const size_t keep = at_end ? 0 : partial_marker_suffix(buf_, tags);
    emit_content(out, std::string_view(buf_).substr(0, buf_.size() - keep));
    buf_.erase(0, buf_.size() - keep);
    return false;
  }
  emit_content(out, std::string_view(buf_).substr(0, m.pos));
  const std::string& tag = tags[m.marker];
  buf_.erase(0, m.pos + tag.size());
  if (tag == kToolCallOpen) {
    held_space_.clear();  // whitespace before a call is formatting
    mode_ = Mode::ToolCall;
    call_state_ = CallState::ExpectFunction;
  } else if (tag == kThinkOpen) {
    mode_ = Mode::Reasoning;
    skip_newline_ = true;
  } else {
    skip_newline_ = true;  // a stray </think>: dropped
  }
  return true;
}

// Whitespace between tags is formatting.
void OutputParser::skip_call_space() {
  size_t n = 0;
  while (n < buf_.size() && is_space(buf_[n])) ++n;
  buf_.erase(0, n);
}

// Stray text where a tag is due: skipped up to the next '<' (at least one byte).
void OutputParser::skip_stray(const char* where) {
  size_t n = buf_.find('<', 1);
  if (n == std::string::npos) n = buf_.size();
  warn("skipped stray text " + std::string(where) + " in tool call");
  buf_.erase(0, n);
}

// Reads a name up to '>' (or a newline, or kMaxNameBytes); true when it is complete.
bool OutputParser::read_call_name(bool at_end) {
  const size_t stop = buf_.find_first_of(">\n");
  if (stop == std::string::npos) {
    call_text_ += buf_;
    buf_.clear();
    if (call_text_.size() <= kMaxNameBytes && !at_end) return false;
    if (at_end) return false;
    warn("over-long name in tool call cut");
    call_text_.resize(kMaxNameBytes);
    return true;
  }
  call_text_.append(buf_, 0, stop);
  buf_.erase(0, buf_[stop] == '>' ? stop + 1 : stop);
  if (call_text_.size() > kMaxNameBytes) {
    warn("over-long name in tool call cut");
    call_text_.resize(kMaxNameBytes);
  }
  return true;
}

// The states where a tag is due: <function=, <parameter=, </function> or </tool_call>.
// Each has its tags (in match order) with the state each leads to; </tool_call> closes the
// call instead. Anything else is skipped as stray text.
bool OutputParser::step_call_tag(std::vector<OutputDelta>& out, bool at_end) {
  struct DueTags {
    std::array<std::string_view, 3> tags;
    std::array<CallState, 3> next;
    size_t count;
    const char* stray_where;
  };
  static constexpr DueTags kExpectFunction{
      {kFunctionOpen, kToolCallClose}, {CallState::FunctionName}, 2, "before <function="};
  static constexpr DueTags kExpectParameter{{kParameterOpen, kFunctionClose, kToolCallClose},
                                            {CallState::ParameterName, CallState::ExpectCallEnd},
                                            3,
                                            "between parameters"};
  static constexpr DueTags kExpectCallEnd{{kToolCallClose}, {}, 1, "after </function>"};
  skip_call_space();
  if (buf_.empty()) return false;
  const DueTags& due = call_state_ == CallState::ExpectFunction    ? kExpectFunction
                       : call_state_ == CallState::ExpectParameter ? kExpectParameter
                                                                   : kExpectCallEnd;
  const int t = match_tag(buf_, std::span(due.tags.data(), due.count), at_end);
  if (t == -2) return false;
  if (t == -1) {
    skip_stray(due.stray_where);
    return true;
  }
  const std::string_view tag = due.tags[size_t(t)];
  buf_.erase(0, tag.size());
  if (tag == kToolCallClose) {
    close_call(out);
  } else {
    const CallState next = due.next[size_t(t)];
    if (next != CallState::ExpectCallEnd) call_text_.clear();  // a name follows
    call_state_ = next;
  }
  return true;
}

// Inside <function=...> or <parameter=...>.
bool OutputParser::step_call_name(std::vector<OutputDelta>& out, bool at_end) {
  if (!read_call_name(at_end)) return false;
  if (call_state_ == CallState::FunctionName) {
    start_call(out, std::string(trim(call_text_)));
    call_text_.clear();
    call_state_ = CallState::ExpectParameter;
  } else {
    param_name_ = std::string(trim(call_text_));
    call_text_.clear();
    call_state_ = CallState::ParameterValue;
    open_streamed_value(out);
  }
  return true;
}

// A parameter's value, up to </parameter>: streamed as it comes or collected whole.
bool OutputParser::step_parameter_value(std::vector<OutputDelta>& out, bool at_end) {
  const size_t end = buf_.find(kParameterClose);
  if (end == std::string::npos) {
    const size_t keep = at_end ? 0 : partial_marker_suffix(buf_, {std::string(kParameterClose)});
    if (value_streamed_) {
      stream_value(out, std::string_view(buf_).substr(0, buf_.size() - keep), false);
    } else {
      call_text_.append(buf_, 0, buf_.size() - keep);
    }
    buf_.erase(0, buf_.size() - keep);
    return false;
  }
  if (value_streamed_) {
    stream_value(out, std::string_view(buf_).substr(0, end), true);
  } else {
    call_text_.append(buf_, 0, end);
    finish_parameter(out, call_text_);
  }
  buf_.erase(0, end + kParameterClose.size());
  call_text_.clear();
  call_state_ = CallState::ExpectParameter;
  return true;
}

bool OutputParser::step_call(std::vector<OutputDelta>& out, bool at_end) {
  switch (call_state_) {
    case CallState::ExpectFunction:
    case CallState::ExpectParameter:
    case CallState::ExpectCallEnd:
      return step_call_tag(out, at_end);
    case CallState::FunctionName:
    case CallState::ParameterName:
      return step_call_name(out, at_end);
    case CallState::ParameterValue:
      return step_parameter_value(out, at_end);
  }
  return false;
}

void OutputParser::emit_text(std::vector<OutputDelta>& out, OutputDelta::Kind kind, std::string_view text) {
  if (text.empty()) return;
  if (kind == OutputDelta::Kind::Reasoning) {
    out_.reasoning.append(text);
  } else {
    out_.content.append(text);
  }
  // Consecutive text of one kind within one push goes out as one delta.
  if (!out.empty() && out.back().kind == kind) {
    out.back().text.append(text);
    return;
  }
  OutputDelta d;
  d.kind = kind;
  d.text = std::string(text);
  out.push_back(std::move(d));
}

void OutputParser::emit_content(std::vector<OutputDelta>& out, std::string_view text) {
  if (text.empty()) return;
  size_t last = text.size();
  while (last > 0 && is_space(text[last - 1])) --last;
  if (last == 0) {
    held_space_.append(text);
    return;
  }
  std::string visible = std::move(held_space_);
  visible.append(text.substr(0, last));
  held_space_ = std::string(text.substr(last));
  emit_text(out, OutputDelta::Kind::Content, visible);
}

void OutputParser::start_call(std::vector<OutputDelta>& out, std::string name) {
  ParsedToolCall call;
  call.id = options_.call_id_prefix + std::to_string(out_.tool_calls.size());
  call.name = std::move(name);
  call.known_function = tool_params_.contains(call.name);
  if (!call.known_function) warn("call to undeclared function '" + call.name + "'");
  OutputDelta d;
  d.kind = OutputDelta::Kind::ToolCallStart;
  d.tool_index = int32_t(out_.tool_calls.size());
  d.tool_id = call.id;
  d.tool_name = call.name;
  out.push_back(std::move(d));
  out_.tool_calls.push_back(std::move(call));
  call_started_ = true;
  call_n_params_ = 0;
  call_keys_.clear();
}

const nlohmann::json* OutputParser::parameter_schema(const std::string& key) const {
  const std::string& name = out_.tool_calls.back().name;
  const auto tool = tool_params_.find(name);
  if (tool == tool_params_.end() || !tool->is_object()) return nullptr;
  const auto props = tool->find("properties");
  if (props == tool->end() || !props->is_object()) return nullptr;
  const auto schema = props->find(key);
  return schema == props->end() ? nullptr : &*schema;
}

void OutputParser::finish_parameter(std::vector<OutputDelta>& out, std::string value) {
  if (!call_started_) return;
  // The template writes "\n" + value + "\n" between the tags.
  if (!value.empty() && value.front() == '\n') value.erase(0, 1);
  if (!value.empty() && value.back() == '\n') value.pop_back();
  if (std::find(call_keys_.begin(), call_keys_.end(), param_name_) != call_keys_.end()) {
    warn("repeated parameter '" + param_name_ + "' dropped");
    return;
  }
  call_keys_.push_back(param_name_);
  const json* schema = parameter_schema(param_name_);
  ordered_json v;
  if (schema != nullptr && tool_parameter_is_raw_string(*schema)) {
    v = value;
  } else {
    const std::string_view body = trim(value);
    bool parsed = false;
    if (!body.empty() && grammar::json_text_depth(body, grammar::kMaxJsonTextNesting) <= grammar::kMaxJsonTextNesting) {
      v = ordered_json::parse(body, nullptr, false);
      parsed = !v.is_discarded();
    }
    if (!parsed) v = value;  // not JSON: kept as text
  }
  std::string fragment = call_n_params_ == 0 ? "{" : ",";
  fragment += dump_json(ordered_json(param_name_));
  fragment += ':';
  fragment += dump_json(v);
  ++call_n_params_;
  emit_arguments(out, std::move(fragment));
}

void OutputParser::open_streamed_value(std::vector<OutputDelta>& out) {
  value_streamed_ = false;
  value_started_ = false;
  value_held_.clear();
  if (!call_started_) return;
  const json* schema = parameter_schema(param_name_);
  if (schema == nullptr || !tool_parameter_is_raw_string(*schema)) return;  // one fragment at its end
  if (std::find(call_keys_.begin(), call_keys_.end(), param_name_) != call_keys_.end()) return;  // a repeat: dropped
  call_keys_.push_back(param_name_);
  value_streamed_ = true;
  std::string fragment = call_n_params_ == 0 ? "{" : ",";
  fragment += dump_json(ordered_json(param_name_));
  fragment += ":\"";
  ++call_n_params_;
  emit_arguments(out, std::move(fragment));
}

void OutputParser::stream_value(std::vector<OutputDelta>& out, std::string_view text, bool last) {
  value_held_.append(text);
  // The template writes "\n" + value + "\n" between the tags: one newline at each end is
  // formatting. The first is dropped once known; a final one is held until more text
  // shows it was not the last.
  if (!value_started_ && !value_held_.empty()) {
    if (value_held_.front() == '\n') value_held_.erase(0, 1);
    value_started_ = true;
  }
  if (!value_started_ && !last) return;
  size_t n = value_held_.size();
  if (n > 0 && value_held_[n - 1] == '\n') --n;  // last: dropped; else: held
  std::string fragment;
  if (n > 0) {
    const std::string quoted = dump_json(ordered_json(value_held_.substr(0, n)));
    fragment = quoted.substr(1, quoted.size() - 2);  // the escaped characters, no quotes
  }
  value_held_.erase(0, n);
  if (last) {
    fragment += '"';
    value_held_.clear();
    value_streamed_ = false;
  }
  if (!fragment.empty()) emit_arguments(out, std::move(fragment));
}

void OutputParser::emit_arguments(std::vector<OutputDelta>& out, std::string fragment) {
  out_.tool_calls.back().arguments += fragment;
  // Consecutive fragments of one call within one push go out as one delta.
  if (!out.empty() && out.back().kind == OutputDelta::Kind::ToolCallArguments &&
      out.back().tool_index == int32_t(out_.tool_calls.size() - 1)) {
    out.back().text += fragment;
    return;
  }
  OutputDelta d;
  d.kind = OutputDelta::Kind::ToolCallArguments;
  d.tool_index = int32_t(out_.tool_calls.size() - 1);
  d.text = std::move(fragment);
  out.push_back(std::move(d));
}

void OutputParser::close_call(std::vector<OutputDelta>& out) {
  if (call_started_) {
    emit_arguments(out, call_n_params_ == 0 ? "{}" : "}");
  } else {
    warn("tool call without a function name dropped");
  }
  mode_ = Mode::Content;
  after_call_ = true;
  call_state_ = CallState::ExpectFunction;
  call_started_ = false;
  call_text_.clear();
  param_name_.clear();
  call_n_params_ = 0;
  call_keys_.clear();
  value_streamed_ = false;
  value_held_.clear();
}

void OutputParser::warn(std::string message) {
  if (out_.warnings.size() < kMaxWarnings) {
    out_.warnings.push_back(std::move(message));
  } else if (out_.warnings.size() == kMaxWarnings) {
    out_.warnings.push_back("further warnings omitted");
  }
}

}  // namespace step35
