// Chat-template conformance: published chat templates x conversations rendered by step35's
// Jinja interpreter must be byte-identical to Python's jinja2 in transformers' environment.
//
// tests/data/chat_templates/: manifest.json (templates and their special tokens),
// templates/*.jinja (published model data), conversations/*.json, expected/<template>/
// <conversation>.txt (jinja2's rendering) or .error (jinja2 raised: kind, type, message),
// written by tests/scripts/chat_template_expectations.py --write.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "gguf/gguf.h"
#include "jinja/template.h"
#include "support.h"

namespace {

using step35::jinja::Error;
using step35::jinja::ErrorKind;
using step35::jinja::RenderOptions;
using step35::jinja::Template;
using ordered_json = nlohmann::ordered_json;
namespace fs = std::filesystem;

const std::string kData = std::string(PROJECT_SOURCE_DIR) + "/tests/data/chat_templates";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

ordered_json read_ordered_json(const std::string& path) { return ordered_json::parse(read_text(path)); }

const char* kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::Syntax: return "syntax";
    case ErrorKind::Undefined: return "undefined";
    case ErrorKind::Type: return "type";
    case ErrorKind::Security: return "security";
    case ErrorKind::Raised: return "raised";
    case ErrorKind::Limit: return "limit";
  }
  return "?";
}

// The variables apply_chat_template passes (the script's render_variables).
ordered_json render_variables(const ordered_json& tmpl, const ordered_json& conversation) {
  ordered_json v = ordered_json::object();
  v["messages"] = conversation.at("messages");
  v["tools"] = conversation.contains("tools") ? conversation["tools"] : ordered_json();
  v["documents"] = ordered_json();
  v["add_generation_prompt"] = conversation.value("add_generation_prompt", false);
  if (tmpl.contains("variables"))
    for (const auto& [key, value] : tmpl["variables"].items()) v[key] = value;
  if (conversation.contains("extra"))
    for (const auto& [key, value] : conversation["extra"].items()) v[key] = value;
  return v;
}

// Where two texts first differ, with some context, for a readable failure.
std::string first_difference(const std::string& expected, const std::string& actual) {
  size_t i = 0;
  while (i < expected.size() && i < actual.size() && expected[i] == actual[i]) ++i;
  const size_t from = i > 60 ? i - 60 : 0;
  return "first difference at byte " + std::to_string(i) + "\n  jinja2: " +
         ordered_json(expected.substr(from, 120)).dump(-1, ' ', false, ordered_json::error_handler_t::replace) +
         "\n  step35: " + ordered_json(actual.substr(from, 120)).dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

std::map<std::string, ordered_json> conversations() {
  std::map<std::string, ordered_json> all;
  for (const auto& entry : fs::directory_iterator(kData + "/conversations")) {
    if (entry.path().extension() == ".json") all[entry.path().stem().string()] = read_ordered_json(entry.path().string());
  }
  return all;
}

TEST(JinjaConformance, EveryTemplateRendersEveryConversationAsJinja2) {
  const ordered_json manifest = read_ordered_json(kData + "/manifest.json");
  const auto convs = conversations();
  ASSERT_GE(convs.size(), 20u);
  ASSERT_GE(manifest["templates"].size(), 8u);
  RenderOptions options;
  const int64_t now_unix = manifest["now_unix"].get<int64_t>();
  options.now = [now_unix] { return std::chrono::system_clock::time_point(std::chrono::seconds(now_unix)); };
  size_t compared = 0, errors_matched = 0;
  for (const ordered_json& tmpl : manifest["templates"]) {
    const std::string name = tmpl["name"].get<std::string>();
    std::unique_ptr<Template> parsed;
    try {
      parsed = std::make_unique<Template>(read_text(kData + "/" + tmpl["file"].get<std::string>()));
    } catch (const Error& e) {
      ADD_FAILURE() << name << ": does not parse: " << e.what();
      continue;
    }
    for (const auto& [conv_name, conversation] : convs) {
      SCOPED_TRACE(name + " x " + conv_name);
      const std::string base = kData + "/expected/" + name + "/" + conv_name;
      const bool expect_error = fs::exists(base + ".error");
      ASSERT_TRUE(expect_error || fs::exists(base + ".txt")) << "no expectation: run tests/scripts/chat_template_expectations.py --write";
      std::string rendered;
      std::optional<Error> error;
      try {
        rendered = parsed->render_json(render_variables(tmpl, conversation), options);
      } catch (const Error& e) {
        error = e;
      }
      ++compared;
      if (!expect_error) {
        if (error) {
          ADD_FAILURE() << "jinja2 renders it, step35 fails: " << error->what();
        } else {
          const std::string expected = read_text(base + ".txt");
          EXPECT_TRUE(rendered == expected) << first_difference(expected, rendered);
        }
        continue;
      }
      const ordered_json want = read_ordered_json(base + ".error");
      if (!error) {
        ADD_FAILURE() << "jinja2 raises " << want.dump() << ", step35 renders " << rendered.size() << " bytes";
        continue;
      }
      EXPECT_EQ(kind_name(error->kind()), want["kind"].get<std::string>()) << error->what() << " vs " << want.dump();
      if (want["kind"] == "raised") {
        EXPECT_EQ(error->message(), want["message"].get<std::string>());
      }
      ++errors_matched;
    }
  }
  EXPECT_EQ(compared, manifest["templates"].size() * convs.size());
  std::printf("compared %zu renderings (%zu of them template errors)\n", compared, errors_matched);
}

// The committed expectations are jinja2's renderings today: re-render them live.
TEST(JinjaConformance, ExpectationsAreWhatJinja2RendersNow) {
  std::string out, err;
  const std::string cmd = "python3 " + std::string(PROJECT_SOURCE_DIR) +
                          "/tests/scripts/chat_template_expectations.py --check --data " + kData;
  const int status = step35::testing::run_command(cmd, &out, &err);
  if (status == 77 || status == 127) GTEST_SKIP() << "python3 with jinja2 (Debian python3-jinja2) is not installed: " << err;
  EXPECT_EQ(status, 0) << out << err;
}

// Random templates (tests/scripts/jinja_random_cases.py: operators, filters, tests and
// methods over every value type; nested statements with every whitespace-control
// combination) rendered by jinja2 now and by step35: same text, or an error of the same kind.
TEST(JinjaDifferential, RandomTemplatesRenderAsJinja2) {
  std::string out, err;
  const std::string cmd = "python3 " + std::string(PROJECT_SOURCE_DIR) +
                          "/tests/scripts/jinja_random_cases.py --seed 35 --expressions 1200 --statements 600";
  const int status = step35::testing::run_command(cmd, &out, &err);
  if (status == 77 || status == 127) GTEST_SKIP() << "python3 with jinja2 (Debian python3-jinja2) is not installed: " << err;
  ASSERT_EQ(status, 0) << err;
  std::istringstream lines(out);
  std::string line;
  size_t cases = 0, mismatches = 0;
  RenderOptions options;
  options.now = [] { return std::chrono::system_clock::time_point(std::chrono::seconds(1721995200)); };
  while (std::getline(lines, line)) {
    const ordered_json record = ordered_json::parse(line);
    const std::string source = record["template"].get<std::string>();
    ++cases;
    std::string rendered;
    std::optional<Error> error;
    try {
      rendered = Template(source).render_json(ordered_json::object(), options);
    } catch (const Error& e) {
      error = e;
    }
    if (record.contains("output")) {
      if (error || rendered != record["output"].get<std::string>()) {
        ++mismatches;
        ADD_FAILURE() << source << "\n  jinja2: " << record["output"].dump() << "\n  step35: "
                      << (error ? std::string(error->what()) : ordered_json(rendered).dump());
      }
    } else if (!error || kind_name(error->kind()) != record["error"].get<std::string>()) {
      ++mismatches;
      ADD_FAILURE() << source << "\n  jinja2 raises: " << record["error"].get<std::string>() << "\n  step35: "
                    << (error ? std::string(error->what()) : "renders " + ordered_json(rendered).dump());
    }
    if (mismatches > 20) break;  // enough to see a pattern
  }
  EXPECT_EQ(cases, 1800u);
}

// The tiny fixtures embed their own template: the suite's copy must be that one.
TEST(JinjaConformance, FixtureTemplateIsTheOneInTheFixtureModels) {
  const auto file = step35::gguf::File::open(step35::testing::fixture_model("tiny-a-f32.gguf"));
  EXPECT_EQ(file->get_str("tokenizer.chat_template"), read_text(kData + "/templates/tiny-fixture.jinja"));
}

}  // namespace
