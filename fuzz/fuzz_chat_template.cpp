// libFuzzer target: arbitrary message JSON through the chat template (both formats).
// Built by CMake with -DSTEP35_FUZZ=ON (see fuzz/run.sh).
//
// Input: a JSON value. An array is the messages; an object may carry "messages", "tools",
// "template" (a string: the GGUF chat template source, which picks the format) and "bos".
// Contract checked: a template source that does not parse is refused with
// std::runtime_error when loaded; bad messages or tools, and template errors, are rejected
// with std::invalid_argument (the server turns that into a 400), never another exception,
// a crash or UB; the parsed messages (ChatMessage) render the same text as the JSON.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"

using namespace step35;

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_chat_template: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::ordered_json in = nlohmann::ordered_json::parse(data, data + size, nullptr, false);
  if (in.is_discarded()) return 0;
  nlohmann::json messages = nlohmann::json::parse(in.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  std::string source, bos = "<s>";
  if (in.is_object()) {
    messages = messages.contains("messages") ? messages["messages"] : nlohmann::json();
    if (in.contains("tools")) tools = in["tools"];
    if (in.contains("template") && in["template"].is_string()) source = in["template"].get<std::string>();
    if (in.contains("bos") && in["bos"].is_string()) bos = in["bos"].get<std::string>();
  }
  const bool gen_prompt = size % 2 == 0;
  std::unique_ptr<ChatTemplate> tmpl;
  try {
    tmpl = std::make_unique<ChatTemplate>(source, bos);
  } catch (const std::runtime_error&) {
    return 0;  // a template that does not parse is refused when it is loaded
  }
  try {
    ChatRenderOptions options;
    options.add_generation_prompt = gen_prompt;
    const std::string out = tmpl->render(nlohmann::ordered_json(messages), tools, options);
    // The parsed messages render the same text.
    const std::vector<ChatMessage> msgs = ChatTemplate::messages_from_json(messages);
    if (tmpl->render(msgs, tools, gen_prompt) != out) fail("parsed messages render differently", out.substr(0, 64));
  } catch (const std::invalid_argument&) {
  } catch (const std::exception& e) {
    fail("non-invalid_argument exception", e.what());
  }
  return 0;
}
