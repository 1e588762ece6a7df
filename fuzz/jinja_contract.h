// The contract fuzz/fuzz_jinja.cpp checks, shared with the regression replay in
// tests/test_regressions.cpp: arbitrary template source (and variables) through the Jinja
// interpreter of src/jinja.
//
// Input: the template source, optionally followed by a NUL byte and a JSON object of
// variables; without one (or when it does not parse) the variables are a conversation
// with tools, tool calls and tool results, so that real chat templates run deep.
// Contract: parsing and rendering end in a string or a jinja::Error and nothing else —
// no other exception, crash, hang or unbounded allocation (the render limits are lowered
// for fuzzing); an error carries a line; rendering the same variables twice gives the
// same text.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "jinja/template.h"

namespace step35::fuzzing {

inline const nlohmann::ordered_json& default_jinja_variables() {
  static const nlohmann::ordered_json variables = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are a helpful agent."},
      {"role": "user", "content": "What's the weather in Paris? ☀️"},
      {"role": "assistant", "reasoning_content": "Call the tool.", "content": "",
       "tool_calls": [{"id": "a1b2c3d4e", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"location": "Paris", "days": 3, "opts": {"alerts": true}}}}]},
      {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "21 C"},
      {"role": "assistant", "content": "<think>\nok\n</think>\nIt is 21 °C."},
      {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
               "parameters": {"type": "object", "properties": {"location": {"type": "string"}, "days": {"type": "integer"}},
                              "required": ["location"]}}}],
    "documents": null,
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>"
  })");
  return variables;
}

// "" when the contract holds, otherwise what broke it.
inline std::string check_jinja_template(const uint8_t* data, size_t size) {
  const char* text = reinterpret_cast<const char*>(data);
  const void* nul = std::memchr(data, 0, size);
  const size_t source_size = nul == nullptr ? size : static_cast<size_t>(static_cast<const uint8_t*>(nul) - data);
  const std::string source(text, source_size);
  nlohmann::ordered_json variables = default_jinja_variables();
  if (nul != nullptr) {
    auto parsed = nlohmann::ordered_json::parse(text + source_size + 1, text + size, nullptr, false);
    if (!parsed.is_discarded() && parsed.is_object()) variables = std::move(parsed);
  }
  jinja::RenderOptions options;
  options.limits.max_output_bytes = size_t(1) << 20;
  options.limits.max_value_size = size_t(1) << 20;
  options.limits.max_steps = 200'000;
  options.now = [] { return std::chrono::system_clock::time_point(std::chrono::seconds(1721995200)); };
  jinja::Value context;
  try {
    context = jinja::Value::from_json(variables);
  } catch (const jinja::Error&) {
    return "";  // variables nested deeper than values may be
  }
  std::unique_ptr<jinja::Template> tmpl;
  try {
    tmpl = std::make_unique<jinja::Template>(source);
  } catch (const jinja::Error& e) {
    if (!e.has_position()) return std::string("syntax error without a position: ") + e.what();
    return "";
  }
  std::string first;
  try {
    first = tmpl->render(context.dict_value(), options);
  } catch (const jinja::Error& e) {
    if (!e.has_position()) return std::string("render error without a position: ") + e.what();
    return "";
  }
  if (first.size() > options.limits.max_output_bytes) return "output above max_output_bytes";
  std::string second;
  try {
    second = tmpl->render(context.dict_value(), options);
  } catch (const jinja::Error& e) {
    return std::string("the second render of the same variables failed: ") + e.what();
  }
  if (first != second) return "two renders of the same variables differ";
  return "";
}

}  // namespace step35::fuzzing
