// Chat-template rendering cost: an agent conversation of 50 messages (system, user, 24 tool
// calls with their results, the final answer) with 20 tools declared, rendered through the
// Step 3.5 Flash template, parsed once and rendered many times (one core). Target: < 1 ms.
//   build/bin/step35_bench_chat_template [--benchmark_filter=Render]
#include <benchmark/benchmark.h>

#include <fstream>
#include <sstream>
#include <string>

#include "jinja/template.h"

namespace {

using nlohmann::ordered_json;

std::string read_template() {
  std::ifstream in(std::string(PROJECT_SOURCE_DIR) + "/tests/data/chat_templates/templates/stepfun-3.5-flash.jinja");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ordered_json agent_conversation(int n_tools, int n_messages) {
  ordered_json tools = ordered_json::array();
  for (int t = 0; t < n_tools; ++t) {
    tools.push_back({{"type", "function"},
                     {"function",
                      {{"name", "tool_" + std::to_string(t)},
                       {"description", "Tool number " + std::to_string(t) + ": reads, searches or edits files of the repository."},
                       {"parameters",
                        {{"type", "object"},
                         {"properties",
                          {{"path", {{"type", "string"}, {"description", "File or folder, relative to the root"}}},
                           {"pattern", {{"type", "string"}}},
                           {"limit", {{"type", "integer"}, {"minimum", 1}}},
                           {"options", {{"type", "object"}, {"properties", {{"recursive", {{"type", "boolean"}}}}}}}}},
                         {"required", {"path"}}}}}}});
  }
  ordered_json messages = ordered_json::array();
  messages.push_back({{"role", "system"}, {"content", "You are a coding agent working in a C++ repository."}});
  messages.push_back({{"role", "user"}, {"content", "Find where the chat template is rendered and add a test for it."}});
  for (int i = 0; static_cast<int>(messages.size()) < n_messages - 1; ++i) {
    ordered_json arguments = {{"path", "src/file_" + std::to_string(i) + ".cpp"},
                              {"pattern", "render\\(\"x\"\\)"},
                              {"limit", 20},
                              {"options", {{"recursive", true}}}};
    messages.push_back({{"role", "assistant"},
                        {"reasoning_content", "I should look at file " + std::to_string(i) + " next."},
                        {"content", ""},
                        {"tool_calls",
                         {{{"id", "call" + std::to_string(i)},
                           {"type", "function"},
                           {"function", {{"name", "tool_" + std::to_string(i % n_tools)}, {"arguments", arguments}}}}}}});
    messages.push_back({{"role", "tool"},
                        {"tool_call_id", "call" + std::to_string(i)},
                        {"content", "src/file_" + std::to_string(i) + ".cpp:42: std::string render(const Chat& chat);\n"
                                    "src/file_" + std::to_string(i) + ".cpp:57:   return template_.render(chat);"}});
  }
  messages.push_back({{"role", "assistant"}, {"content", "The template is rendered in src/chat; I added a test."}});
  return {{"messages", messages}, {"tools", tools}, {"add_generation_prompt", true},
          {"bos_token", "<s>"}, {"eos_token", "</s>"}};
}

void BM_RenderStep35AgentConversation(benchmark::State& state) {
  const step35::jinja::Template tmpl(read_template());
  const ordered_json variables = agent_conversation(20, 50);
  // The variables as the server would hand them over: converted once per request.
  const step35::jinja::Value context = step35::jinja::Value::from_json(variables);
  size_t bytes = 0;
  for (auto _ : state) {
    const std::string prompt = tmpl.render(context.dict_value());
    bytes = prompt.size();
    benchmark::DoNotOptimize(prompt.data());
  }
  state.counters["prompt_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_RenderStep35AgentConversation)->Unit(benchmark::kMicrosecond);

// The same with the JSON -> value conversion included (what one request costs end to end).
void BM_RenderStep35AgentConversationFromJson(benchmark::State& state) {
  const step35::jinja::Template tmpl(read_template());
  const ordered_json variables = agent_conversation(20, 50);
  for (auto _ : state) {
    const std::string prompt = tmpl.render_json(variables);
    benchmark::DoNotOptimize(prompt.data());
  }
}
BENCHMARK(BM_RenderStep35AgentConversationFromJson)->Unit(benchmark::kMicrosecond);

void BM_ParseStep35Template(benchmark::State& state) {
  const std::string source = read_template();
  for (auto _ : state) {
    step35::jinja::Template tmpl(source);
    benchmark::DoNotOptimize(&tmpl);
  }
}
BENCHMARK(BM_ParseStep35Template)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
