// Replays the fuzz seed corpora (fuzz/corpus/<target>/) and every input a fuzzer once
// crashed on (tests/data/regressions/<target>/, one file per finding, named after it)
// through the same contracts the fuzz targets check, in the normal and sanitizer builds:
//   gguf           parse + model load end in success or gguf::Error;
//   tokenizer      encode/decode round trip on arbitrary bytes;
//   chat_template  messages render or are refused with std::invalid_argument (a template
//                  source that does not parse: std::runtime_error when it is loaded);
//   server_requests  request bodies are planned within limits or refused with a 4xx
//                    (fuzz/server_request_contract.h);
//   jinja          template sources parse and render or fail with jinja::Error, within
//                  the render limits (fuzz/jinja_contract.h);
//   data_url       image_url URLs give a picture or a 400 naming the part.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "jinja_contract.h"
#include "model/step35.h"
#include "server/api_error.h"
#include "server/chat_images.h"
#include "server_request_contract.h"
#include "support.h"
#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
namespace st = step35::testing;
using namespace step35;

namespace {

// Files of fuzz/corpus/<target> and tests/data/regressions/<target>, sorted.
std::vector<fs::path> inputs(const std::string& target) {
  std::vector<fs::path> out;
  for (const std::string& dir : {std::string(PROJECT_SOURCE_DIR) + "/fuzz/corpus/" + target,
                                std::string(PROJECT_SOURCE_DIR) + "/tests/data/regressions/" + target}) {
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(Regressions, GgufInputs) {
  const auto files = inputs("gguf");
  ASSERT_GE(files.size(), 4u) << "the seed corpus is missing";
  size_t loaded = 0;
  for (const fs::path& p : files) {
    const std::vector<uint8_t> b = st::read_bytes(p.string());
    Model::LoadOptions opts;
    opts.verbose = false;
    try {
      Model::load_buffer(b.data(), b.size(), p.filename().string(), opts);
      ++loaded;
    } catch (const gguf::Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << p << ": not a gguf::Error: " << e.what();
    }
  }
  EXPECT_GE(loaded, 1u) << "the valid micro model no longer loads";
}

TEST(Regressions, TokenizerInputs) {
  const auto files = inputs("tokenizer");
  ASSERT_GE(files.size(), 4u);
  auto f = gguf::File::open(st::fixture_model("tiny-a-q4_k_m.gguf"));
  auto tok = Tokenizer::from_gguf(*f);
  for (const fs::path& p : files) {
    const std::vector<uint8_t> b = st::read_bytes(p.string());
    if (b.empty()) continue;
    const std::string text(b.begin() + 1, b.end());
    for (int mode = 0; mode < 3; ++mode) {
      const bool add = mode & 1, special = mode & 2;
      const std::vector<TokenId> ids = tok->encode(text, add, special);
      std::string expect = add && tok->add_bos() ? tok->token_to_piece(tok->bos()) : "";
      EXPECT_EQ(tok->decode(ids), expect + text) << p << " mode " << mode;
    }
  }
}

TEST(Regressions, ChatTemplateInputs) {
  const auto files = inputs("chat_template");
  ASSERT_GE(files.size(), 4u);
  size_t rendered = 0;
  for (const fs::path& p : files) {
    const std::vector<uint8_t> b = st::read_bytes(p.string());
    nlohmann::json in = nlohmann::json::parse(b.begin(), b.end(), nullptr, false);
    if (in.is_discarded()) continue;
    nlohmann::json messages = in.is_object() ? in.value("messages", nlohmann::json()) : in;
    nlohmann::json tools = in.is_object() ? in.value("tools", nlohmann::json::array()) : nlohmann::json::array();
    std::string source = in.is_object() && in.contains("template") && in["template"].is_string()
                             ? in["template"].get<std::string>() : "";
    std::unique_ptr<ChatTemplate> tmpl;
    try {
      tmpl = std::make_unique<ChatTemplate>(source, "<s>");
    } catch (const std::runtime_error&) {
      continue;  // a template that does not parse is refused when it is loaded
    }
    try {
      // As a client sends the conversation, and through the parsed messages.
      const std::string out = tmpl->render(messages, tools, ChatRenderOptions());
      EXPECT_FALSE(out.empty());
      EXPECT_EQ(tmpl->render(ChatTemplate::messages_from_json(messages), tools, true), out) << p;
      ++rendered;
    } catch (const std::invalid_argument&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << p << ": not std::invalid_argument: " << e.what();
    }
  }
  EXPECT_GE(rendered, 4u) << "the valid seeds no longer render";
}

TEST(Regressions, ServerRequestInputs) {
  const auto files = inputs("server_requests");
  ASSERT_GE(files.size(), 9u);
  server::ServerContext& ctx = fuzzing::request_context(STEP35_FIXTURES_DIR);
  for (const fs::path& p : files) {
    const std::vector<uint8_t> b = st::read_bytes(p.string());
    try {
      EXPECT_EQ(fuzzing::check_server_request(ctx, b.data(), b.size()), "") << p;
    } catch (const std::exception& e) {
      ADD_FAILURE() << p << ": an exception other than ApiError: " << e.what();
    }
  }
}

TEST(Regressions, JinjaInputs) {
  const auto files = inputs("jinja");
  ASSERT_GE(files.size(), 12u) << "the seed corpus is missing";
  for (const fs::path& p : files) {
    const std::vector<uint8_t> b = st::read_bytes(p.string());
    try {
      EXPECT_EQ(fuzzing::check_jinja_template(b.data(), b.size()), "") << p;
    } catch (const std::exception& e) {
      ADD_FAILURE() << p << ": an exception other than jinja::Error: " << e.what();
    }
  }
}

TEST(Regressions, DataUrlInputs) {
  const auto files = inputs("data_url");
  ASSERT_GE(files.size(), 6u) << "the seed corpus is missing";
  size_t pictures = 0;
  for (const fs::path& p : files) {
    const std::vector<uint8_t> b = st::read_bytes(p.string());
    try {
      const vision::RgbImage img = server::picture_from_url(std::string(b.begin(), b.end()), "part");
      EXPECT_EQ(img.rgb.size(), size_t(img.nx) * size_t(img.ny) * 3) << p;
      ++pictures;
    } catch (const server::ApiError& e) {
      EXPECT_EQ(e.status(), 400) << p;
      EXPECT_NE(std::string(e.what()).find("part"), std::string::npos) << p << ": " << e.what();
    }
  }
  EXPECT_GE(pictures, 2u);  // the PNG and the wrapped GIF seeds
}
