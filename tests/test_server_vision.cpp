// Pictures over HTTP (`serve --mmproj`): OpenAI image_url parts, Anthropic image blocks and
// Responses input_image parts give llama.cpp's answer for the vision goldens
// (../shared/fixtures/vision: the same prompt through llama-server returns the goldens'
// greedy tokens), the prefix cache reuses a picture's positions only for the same picture,
// and every bad picture is a 400 naming the part, never a crash.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <chrono>

#include "gguf/gguf.h"
#include "serve_process.h"
#include "support.h"
#include "tokenizer/tokenizer.h"

using namespace step35::testing;
using json = nlohmann::json;

namespace {

std::string vision_dir() { return fixtures_dir() + "/vision"; }
std::string vision_model(const std::string& file) { return vision_dir() + "/models/" + file; }

std::string base64(const std::vector<uint8_t>& bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = uint32_t(bytes[i]) << 16 | (i + 1 < bytes.size() ? uint32_t(bytes[i + 1]) << 8 : 0) |
                       (i + 2 < bytes.size() ? uint32_t(bytes[i + 2]) : 0);
    out += abc[n >> 18 & 63];
    out += abc[n >> 12 & 63];
    out += i + 1 < bytes.size() ? abc[n >> 6 & 63] : '=';
    out += i + 2 < bytes.size() ? abc[n & 63] : '=';
  }
  return out;
}

std::string media_type(const std::string& file) {
  const std::string ext = file.substr(file.rfind('.') + 1);
  return ext == "jpg" ? "image/jpeg" : "image/" + ext;
}

std::string data_url(const std::string& file) {
  return "data:" + media_type(file) + ";base64," + base64(read_bytes(vision_dir() + "/images/" + file));
}

// A golden's prompt (`<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n`) as the
// user turn's pieces: text between the media markers, and the pictures in order.
struct UserTurn {
  std::vector<std::string> texts;  // texts.size() == files.size() + 1
  std::vector<std::string> files;
};
UserTurn user_turn(const json& golden) {
  std::string p = golden["prompt"];
  const std::string head = "<|im_start|>user\n", tail = "<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(p.rfind(head, 0), 0u);
  p = p.substr(head.size(), p.size() - head.size() - tail.size());
  UserTurn t;
  for (size_t at = 0;;) {
    const size_t m = p.find("<__media__>", at);
    t.texts.push_back(p.substr(at, m == std::string::npos ? std::string::npos : m - at));
    if (m == std::string::npos) break;
    at = m + 11;
  }
  for (const auto& image : golden["images"]) t.files.push_back(image["file"]);
  return t;
}

json openai_content(const UserTurn& t) {
  json parts = json::array();
  for (size_t i = 0; i < t.texts.size(); ++i) {
    if (!t.texts[i].empty()) parts.push_back({{"type", "text"}, {"text", t.texts[i]}});
    if (i < t.files.size()) parts.push_back({{"type", "image_url"}, {"image_url", {{"url", data_url(t.files[i])}}}});
  }
  return parts;
}

json anthropic_content(const UserTurn& t) {
  json blocks = json::array();
  for (size_t i = 0; i < t.texts.size(); ++i) {
    if (!t.texts[i].empty()) blocks.push_back({{"type", "text"}, {"text", t.texts[i]}});
    if (i < t.files.size())
      blocks.push_back({{"type", "image"},
                        {"source", {{"type", "base64"},
                                    {"media_type", media_type(t.files[i])},
                                    {"data", base64(read_bytes(vision_dir() + "/images/" + t.files[i]))}}}});
  }
  return blocks;
}

json responses_content(const UserTurn& t) {
  json parts = json::array();
  for (size_t i = 0; i < t.texts.size(); ++i) {
    if (!t.texts[i].empty()) parts.push_back({{"type", "input_text"}, {"text", t.texts[i]}});
    if (i < t.files.size()) parts.push_back({{"type", "input_image"}, {"image_url", data_url(t.files[i])}});
  }
  return parts;
}

json post(httplib::Client& c, const std::string& path, const json& body, int* status) {
  auto res = c.Post(path, body.dump(), "application/json");
  *status = res ? res->status : -1;
  return res ? json::parse(res->body, nullptr, false) : json();
}

json chat(const json& content, int max_tokens = 16) {
  return {{"messages", {{{"role", "user"}, {"content", content}}}}, {"temperature", 0}, {"max_tokens", max_tokens}};
}

// The server's flags for the goldens' conditions: one thread, F32 activations and cache.
std::vector<std::string> serve_args(const std::string& mmproj) {
  return {"-m", vision_model("tiny-v-f32.gguf"), "--mmproj", vision_model(mmproj), "-t", "1", "--exact",
          "-ctk", "f32", "-ctv", "f32", "-c", "1024", "--parallel", "2"};
}

}  // namespace

// The goldens' greedy tokens as an answer's text shows them: control tokens (here a
// <patch_end>) carry no text in answers, as in llama-server's; /detokenize renders the rest.
json answer_tokens(const json& greedy) {
  static const auto tok = step35::Tokenizer::from_gguf(*step35::gguf::File::open(vision_model("tiny-v-f32.gguf")));
  json ids = json::array();
  for (int32_t id : greedy)
    if (tok->token_type(id) != step35::TokenType::CONTROL) ids.push_back(id);
  return ids;
}

// Every golden case through the three APIs: the prompt's size and the greedy answer are
// llama.cpp's (the answer compared as text).
TEST(ServeVision, EveryApiAnswersAsLlamaCpp) {
  const json m = read_json(vision_dir() + "/manifest.json");
  for (const std::string mmproj : {"mmproj-tiny-v-f32.gguf", "mmproj-tiny-v-f16.gguf"}) {
    ServeProcess s(serve_args(mmproj), "serve_vision");
    httplib::Client c("127.0.0.1", s.port());
    c.set_read_timeout(120, 0);
    int status = 0;
    const json props = json::parse(c.Get("/props")->body);
    EXPECT_EQ(props["modalities"]["vision"], true);
    const json models = json::parse(c.Get("/v1/models")->body);
    EXPECT_EQ(models["data"][0]["capabilities"], json::array({"completion", "multimodal"}));
    int n_cases = 0, n_images = 0;
    std::set<std::string> files;
    for (const auto& [name, entry] : m["goldens"].items()) {
      if (entry["mmproj"] != mmproj) continue;
      SCOPED_TRACE(name);
      ++n_cases;
      const json g = read_json(vision_dir() + "/golden/" + entry["json"].get<std::string>());
      const UserTurn turn = user_turn(g);
      n_images += int(turn.files.size());
      files.insert(turn.files.begin(), turn.files.end());
      const json want = post(c, "/detokenize", {{"tokens", answer_tokens(g["greedy"])}}, &status);
      ASSERT_EQ(status, 200);
      json r = post(c, "/v1/chat/completions", chat(openai_content(turn)), &status);
      ASSERT_EQ(status, 200) << r.dump();
      EXPECT_EQ(r["usage"]["prompt_tokens"], g["n_positions"]);
      EXPECT_EQ(r["choices"][0]["message"]["content"], want["content"]);
      json a = post(c, "/v1/messages",
                    {{"model", "m"}, {"max_tokens", 16}, {"temperature", 0},
                     {"messages", {{{"role", "user"}, {"content", anthropic_content(turn)}}}}},
                    &status);
      ASSERT_EQ(status, 200) << a.dump();
      EXPECT_EQ(a["usage"]["input_tokens"], g["n_positions"]);
      EXPECT_EQ(a["content"][0]["text"], want["content"]);
      json o = post(c, "/v1/responses",
                    {{"max_output_tokens", 16}, {"temperature", 0}, {"store", false},
                     {"input", {{{"role", "user"}, {"content", responses_content(turn)}}}}},
                    &status);
      ASSERT_EQ(status, 200) << o.dump();
      EXPECT_EQ(o["usage"]["input_tokens"], g["n_positions"]);
      EXPECT_EQ(o["output"].back()["content"][0]["text"], want["content"]);
    }
    EXPECT_GT(n_cases, 0);
    // Three requests per picture; each distinct picture through the tower once (then the cache).
    const std::string metrics = c.Get("/metrics")->body;
    EXPECT_NE(metrics.find("step35_images_total " + std::to_string(3 * n_images) + "\n"), std::string::npos)
        << n_images;
    EXPECT_NE(metrics.find("step35_images_encoded_total " + std::to_string(files.size()) + "\n"), std::string::npos)
        << files.size();
    EXPECT_EQ(s.terminate(), 0);
  }
}

// The prefix cache keys a picture's positions by its pixels: the same picture again reuses
// them (and answers the same), another picture of the same size at the same place does not.
// The tower's cache: a picture sent again is not encoded again (unless --image-cache 0).
TEST(ServeVision, PrefixCacheReusesOnlyTheSamePicture) {
  for (const bool image_cache : {true, false}) {
  SCOPED_TRACE(image_cache);
  std::vector<std::string> args = serve_args("mmproj-tiny-v-f32.gguf");
  if (!image_cache) args.insert(args.end(), {"--image-cache", "0"});
  ServeProcess s(args, "serve_vision_cache");
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(120, 0);
  int status = 0;
  const json png = chat(openai_content({{"", "\nDescribe this."}, {"square-300.png"}}));
  const json jpg = chat(openai_content({{"", "\nDescribe this."}, {"square-300.jpg"}}));
  const json first = post(c, "/v1/chat/completions", png, &status);
  ASSERT_EQ(status, 200) << first.dump();
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const json again = post(c, "/v1/chat/completions", png, &status);
  ASSERT_EQ(status, 200);
  // 132 positions: the blocks of 32 before the last position are reused, the picture's included.
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], 128);
  EXPECT_EQ(again["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"]);
  const json other = post(c, "/v1/chat/completions", jpg, &status);
  ASSERT_EQ(status, 200);
  // Only text before the picture could match (7 positions: no whole block).
  EXPECT_EQ(other["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(other["usage"]["prompt_tokens"], 132);
  // /apply-template renders the marker and encodes nothing.
  const json applied = post(c, "/apply-template", png, &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(applied["prompt"], "<|im_start|>user\n<__media__>\nDescribe this.<|im_end|>\n<|im_start|>assistant\n");
  const std::string after = c.Get("/metrics")->body;
  EXPECT_NE(after.find("step35_images_total 3\n"), std::string::npos) << after;
  EXPECT_NE(after.find(std::string("step35_images_encoded_total ") + (image_cache ? "2" : "3") + "\n"),
            std::string::npos) << after;
  // The same picture with a longer question: the picture's positions come from the prefix
  // cache, its rows from the tower's cache; the answer is the one a fresh server gives.
  json longer = png;
  longer["messages"][0]["content"][1]["text"] = "\nDescribe this, and then say what colour it is.";
  const json more = post(c, "/v1/chat/completions", longer, &status);
  ASSERT_EQ(status, 200);
  EXPECT_GE(more["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 96);
  EXPECT_EQ(s.terminate(), 0);
  if (image_cache) {
    ServeProcess fresh(serve_args("mmproj-tiny-v-f32.gguf"), "serve_vision_fresh");
    httplib::Client f("127.0.0.1", fresh.port());
    f.set_read_timeout(120, 0);
    const json want = post(f, "/v1/chat/completions", longer, &status);
    ASSERT_EQ(status, 200);
    EXPECT_EQ(more["choices"][0]["message"]["content"], want["choices"][0]["message"]["content"]);
    EXPECT_EQ(fresh.terminate(), 0);
  }
  }
}

// Bad pictures and pictures a server cannot take: 400 naming the part, the server alive.
TEST(ServeVision, BadPicturesAreClientErrors) {
  ServeProcess s(serve_args("mmproj-tiny-v-f32.gguf"), "serve_vision_errors");
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(120, 0);
  auto part = [](const json& image_url) {
    return chat(json::array({{{"type", "text"}, {"text", "look"}}, {{"type", "image_url"}, {"image_url", image_url}}}));
  };
  const std::vector<uint8_t> png = read_bytes(vision_dir() + "/images/square-300.png");
  struct Case {
    json body;
    std::string says;
  };
  const std::vector<Case> cases = {
      {part({{"url", "https://example.com/cat.png"}}), "--allow-image-urls"},
      {part({{"url", "data:image/png,rawbytes"}}), "base64-encoded"},
      {part({{"url", "data:image/png;base64,@@@@"}}), "not valid base64"},
      {part({{"url", "data:image/png;base64," + base64(std::vector<uint8_t>(500, 'x'))}}), "messages[0].content[1]"},
      {part({{"url", "data:image/png;base64," + base64({png.begin(), png.begin() + 400})}}), "messages[0].content[1]"},
      {part({{"detail", "high"}}), "image_url"},
      {part(42), "image_url"},
      // The marker typed as text beside a picture: two markers, one picture.
      {chat(json::array({{{"type", "text"}, {"text", "<__media__>"}},
                         {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64," + base64(png)}}}}})),
       "media marker"},
  };
  for (const Case& k : cases) {
    int status = 0;
    const json r = post(c, "/v1/chat/completions", k.body, &status);
    EXPECT_EQ(status, 400) << r.dump();
    EXPECT_NE(r.dump().find(k.says), std::string::npos) << r.dump();
  }
  int status = 0;
  const json r = post(c, "/v1/messages",
                      {{"model", "m"}, {"max_tokens", 4},
                       {"messages", {{{"role", "user"}, {"content", {{{"type", "image"}, {"source", {{"type", "file"}}}}}}}}}},
                      &status);
  EXPECT_EQ(status, 400) << r.dump();
  EXPECT_TRUE(c.Get("/health"));
  EXPECT_EQ(s.terminate(), 0);

  // A server without --mmproj says how to get one.
  ServeProcess text_only({"-m", vision_model("tiny-v-f32.gguf"), "-t", "1"}, "serve_vision_text");
  httplib::Client t("127.0.0.1", text_only.port());
  const json no = post(t, "/v1/chat/completions", part({{"url", "data:image/png;base64," + base64(png)}}), &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(no.dump().find("--mmproj"), std::string::npos) << no.dump();
  EXPECT_EQ(json::parse(t.Get("/props")->body)["modalities"]["vision"], false);
  EXPECT_EQ(json::parse(t.Get("/v1/models")->body)["data"][0]["capabilities"], json::array({"completion"}));
  EXPECT_EQ(text_only.terminate(), 0);
}

// /tokenize with llama-server's multimodal prompt object: each golden's prompt and pictures
// give llama.cpp's token layout (-1 at every image position) without encoding anything.
TEST(ServeVision, TokenizeLaysOutPicturesAsLlamaCpp) {
  const json m = read_json(vision_dir() + "/manifest.json");
  ServeProcess s(serve_args("mmproj-tiny-v-f32.gguf"), "serve_vision_tokenize");
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(120, 0);
  int status = 0, n_cases = 0;
  for (const auto& [name, entry] : m["goldens"].items()) {
    if (entry["mmproj"] != "mmproj-tiny-v-f32.gguf") continue;
    SCOPED_TRACE(name);
    const json g = read_json(vision_dir() + "/golden/" + entry["json"].get<std::string>());
    json data = json::array();
    for (const auto& image : g["images"]) {
      const std::vector<uint8_t> bytes = read_bytes(vision_dir() + "/images/" + image["file"].get<std::string>());
      data.push_back(n_cases % 2 ? base64(bytes) : "data:image/png;base64," + base64(bytes));  // both forms
    }
    const json r = post(c, "/tokenize", {{"content", {{"prompt_string", g["prompt"]}, {"multimodal_data", data}}}}, &status);
    ASSERT_EQ(status, 200) << r.dump();
    EXPECT_EQ(r["tokens"], g["token_layout"]);
    EXPECT_EQ(r["count"], g["token_layout"].size());
    EXPECT_EQ(r["image_tokens"], g["n_image_tokens"]);
    ++n_cases;
  }
  EXPECT_GE(n_cases, 5);
  // Counting is not encoding: the tower ran for no picture.
  const auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("step35_images_encoded_total 0\n"), std::string::npos) << metrics->body;
  const std::vector<uint8_t> png = read_bytes(vision_dir() + "/images/square-300.png");
  struct Case {
    json content;
    std::string says;
  };
  const std::vector<Case> bad = {
      {{{"prompt_string", "two <__media__> <__media__>"}, {"multimodal_data", {base64(png)}}}, "media marker"},
      {{{"prompt_string", "<__media__>"}, {"multimodal_data", {"@@@"}}}, "content.multimodal_data[0]"},
      {{{"prompt_string", "<__media__>"}, {"multimodal_data", {42}}}, "content.multimodal_data[0]"},
      {{{"multimodal_data", {base64(png)}}}, "content.prompt_string"},
      {{{"prompt_string", "x"}, {"images", json::array()}}, "content.images"},
  };
  for (const Case& k : bad) {
    const json r = post(c, "/tokenize", {{"content", k.content}}, &status);
    EXPECT_EQ(status, 400) << r.dump();
    EXPECT_NE(r.dump().find(k.says), std::string::npos) << r.dump();
  }
  EXPECT_EQ(s.terminate(), 0);
}

// Pictures by http URL on a server started with --allow-image-urls: the same answer as the
// same bytes in a data: URL through all three APIs; redirects followed up to the limit; a
// failed, refused, oversize, slow or non-picture fetch is a 400 naming the part.
TEST(ServeVision, PicturesByUrlWhenAllowed) {
  const std::vector<uint8_t> png = read_bytes(vision_dir() + "/images/square-300.png");
  const std::string png_body(png.begin(), png.end());
  httplib::Server pictures;
  pictures.Get("/square.png", [&](const httplib::Request&, httplib::Response& r) { r.set_content(png_body, "image/png"); });
  pictures.Get("/moved", [](const httplib::Request&, httplib::Response& r) { r.set_redirect("/square.png"); });
  pictures.Get("/loop", [](const httplib::Request&, httplib::Response& r) { r.set_redirect("/loop"); });
  pictures.Get("/big", [](const httplib::Request&, httplib::Response& r) {
    r.set_content(std::string((size_t(1) << 20) + 1, 'x'), "image/png");
  });
  pictures.Get("/slow", [&](const httplib::Request&, httplib::Response& r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    r.set_content(png_body, "image/png");
  });
  pictures.Get("/text", [](const httplib::Request&, httplib::Response& r) { r.set_content("not a picture", "text/plain"); });
  const int pic_port = pictures.bind_to_any_port("127.0.0.1");
  ASSERT_GT(pic_port, 0);
  std::thread pic_thread([&] { pictures.listen_after_bind(); });
  const std::string origin = "http://127.0.0.1:" + std::to_string(pic_port);

  std::vector<std::string> args = serve_args("mmproj-tiny-v-f32.gguf");
  for (const char* a : {"--allow-image-urls", "--image-url-timeout", "1", "--image-url-max", "1"}) args.push_back(a);
  ServeProcess s(args, "serve_vision_urls");
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(120, 0);
  auto with_url = [](const std::string& url) {
    return chat(json::array({{{"type", "image_url"}, {"image_url", {{"url", url}}}}, {{"type", "text"}, {"text", "\nWhat is it?"}}}));
  };
  int status = 0;
  const json by_data = post(c, "/v1/chat/completions", with_url("data:image/png;base64," + base64(png)), &status);
  ASSERT_EQ(status, 200) << by_data.dump();
  const std::string want = by_data["choices"][0]["message"]["content"];
  const int64_t want_prompt = by_data["usage"]["prompt_tokens"];
  for (const std::string path : {"/square.png", "/moved"}) {
    const json r = post(c, "/v1/chat/completions", with_url(origin + path), &status);
    ASSERT_EQ(status, 200) << path << " " << r.dump();
    EXPECT_EQ(r["choices"][0]["message"]["content"], want) << path;
    EXPECT_EQ(r["usage"]["prompt_tokens"], want_prompt) << path;
  }
  const json anthropic = post(c, "/v1/messages",
                              {{"model", "m"}, {"max_tokens", 16}, {"temperature", 0},
                               {"messages", {{{"role", "user"}, {"content", {
                                   {{"type", "image"}, {"source", {{"type", "url"}, {"url", origin + "/square.png"}}}},
                                   {{"type", "text"}, {"text", "\nWhat is it?"}}}}}}}},
                              &status);
  ASSERT_EQ(status, 200) << anthropic.dump();
  EXPECT_EQ(anthropic["content"][0]["text"], want);
  const json responses = post(c, "/v1/responses",
                              {{"model", "m"}, {"max_output_tokens", 16}, {"temperature", 0},
                               {"input", {{{"role", "user"}, {"content", {
                                   {{"type", "input_image"}, {"image_url", origin + "/square.png"}},
                                   {{"type", "input_text"}, {"text", "\nWhat is it?"}}}}}}}},
                              &status);
  ASSERT_EQ(status, 200) << responses.dump();
  EXPECT_EQ(responses["output"].back()["content"][0]["text"], want);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {origin + "/missing", "HTTP 404"},
      {origin + "/loop", "more than 3 redirects"},
      {origin + "/big", "larger than 1048576 bytes"},
      {origin + "/slow", "longer than 1 s"},
      {origin + "/text", "messages[0].content[0]"},
      {"http://127.0.0.1:1/none.png", "could not fetch"},
      {"ftp://127.0.0.1/x.png", "data: URL"},
  };
  for (const auto& [url, says] : bad) {
    const json r = post(c, "/v1/chat/completions", with_url(url), &status);
    EXPECT_EQ(status, 400) << url << " " << r.dump();
    EXPECT_NE(r.dump().find(says), std::string::npos) << url << " " << r.dump();
    EXPECT_NE(r.dump().find("messages[0].content[0]"), std::string::npos) << r.dump();
  }
  EXPECT_TRUE(c.Get("/health"));
  EXPECT_EQ(s.terminate(), 0);
  pictures.stop();
  pic_thread.join();
}

// An mmproj the text model cannot take is refused at start, naming the reason.
TEST(ServeVision, AnMmprojForAnotherModelIsAStartupError) {
  std::string out, err;
  const int rc = run_command("timeout 60 " + step35_binary() + " serve -m " + fixture_model("tiny-a-f32.gguf") +
                                 " --mmproj " + vision_model("mmproj-tiny-v-f32.gguf") + " --port 0 -t 1",
                             &out, &err);
  EXPECT_EQ(rc, 1) << err;
  EXPECT_NE(err.find("<im_start>"), std::string::npos) << err;
  EXPECT_NE(err.find("--mmproj"), std::string::npos) << err;
}

// MTP drafting with pictures in the prompt (the sidecar of tiny-v, regenerated): the blocks
// catch up over the picture positions on the pictures' rows, drafts are proposed, and the
// answer is the one without drafting (llama.cpp's tree answers HTTP 500 here).
TEST(ServeVision, MtpDraftsOverPicturesAndChangesNoAnswer) {
  std::string why;
  const std::string sidecar = regenerated_fixture("mtp-tiny-v-f32.gguf", &why, "vision");
  if (sidecar.empty()) GTEST_SKIP() << why;
  const json m = read_json(vision_dir() + "/manifest.json");
  std::vector<std::string> answers[2];
  for (const int mtp : {0, 3}) {
    std::vector<std::string> args = serve_args("mmproj-tiny-v-f32.gguf");
    args.insert(args.end(), {"--mtp-model", sidecar, "--mtp", std::to_string(mtp)});
    ServeProcess s(args, "serve_vision_mtp");
    httplib::Client c("127.0.0.1", s.port());
    c.set_read_timeout(120, 0);
    for (const auto& [name, entry] : m["goldens"].items()) {
      if (entry["mmproj"] != "mmproj-tiny-v-f32.gguf") continue;
      const json g = read_json(vision_dir() + "/golden/" + entry["json"].get<std::string>());
      int status = 0;
      const json r = post(c, "/v1/chat/completions", chat(openai_content(user_turn(g)), 24), &status);
      ASSERT_EQ(status, 200) << name << r.dump();
      answers[mtp ? 1 : 0].push_back(r["choices"][0]["message"]["content"]);
    }
    const std::string metrics = c.Get("/metrics")->body;
    const std::string drafted = "step35_mtp_drafts_total{position=\"1\"} ";
    const size_t at = metrics.find(drafted);
    if (mtp) {
      ASSERT_NE(at, std::string::npos) << metrics;
      EXPECT_GT(std::stoll(metrics.substr(at + drafted.size())), 0) << metrics.substr(at, 80);
    }
    EXPECT_EQ(s.terminate(), 0);
  }
  EXPECT_EQ(answers[1], answers[0]);
  EXPECT_GE(answers[0].size(), 5u);
}
