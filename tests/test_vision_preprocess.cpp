// The step3vl picture preparation against llama.cpp (../shared/fixtures/vision): stb's RGB of
// every picture, the slice geometry, the token layout of every golden prompt and the
// normalised pixels of every image chunk (sums, extremes and sampled values).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "support.h"
#include "tokenizer/tokenizer.h"
#include "vision/embedding_cache.h"
#include "vision/image.h"
#include "vision/picture_digest.h"
#include "vision/step3vl_preprocess.h"

using namespace step35;
using namespace step35::vision;
using namespace step35::testing;
using json = nlohmann::json;

namespace {

std::string vision_dir() { return fixtures_dir() + "/vision"; }
json manifest() { return read_json(vision_dir() + "/manifest.json"); }

RgbImage decode_file(const std::string& path) {
  const std::vector<uint8_t> bytes = read_bytes(path);
  return decode_image(bytes.data(), bytes.size());
}

std::string sha256_of(const std::vector<uint8_t>& bytes) {
  const std::string path = tmp_dir() + "/rgb." + std::to_string(::getpid()) + ".bin";
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  std::string out;
  run_command("sha256sum '" + path + "'", &out);
  std::remove(path.c_str());
  return out.substr(0, 64);
}

Step3vlConfig tiny_config() {
  auto f = gguf::File::open(vision_dir() + "/models/mmproj-tiny-v-f32.gguf");
  return step3vl_config(*f);
}

TEST(VisionDecode, EveryPictureIsStbsRgb) {
  const json images = manifest()["images"];
  ASSERT_GE(images.size(), 12u);
  for (const auto& [name, want] : images.items()) {
    const RgbImage img = decode_file(vision_dir() + "/images/" + name);
    EXPECT_EQ(img.nx, want["nx"].get<int>()) << name;
    EXPECT_EQ(img.ny, want["ny"].get<int>()) << name;
    EXPECT_EQ(sha256_of(img.rgb), want["rgb_sha256"].get<std::string>()) << name;
    // Our SHA-256 (the caches' picture digest) gives the manifest's digest of the pixels.
    EXPECT_EQ(to_hex(sha256(img.rgb.data(), img.rgb.size())), want["rgb_sha256"].get<std::string>()) << name;
  }
}

// SHA-256 at the lengths where padding changes shape, against sha256sum; the picture digest
// covers the size as well as the pixels.
TEST(VisionDigest, Sha256MatchesSha256sumAndTheDigestSeesTheSize) {
  for (size_t n : {0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 100003}) {
    std::vector<uint8_t> bytes(n);
    for (size_t i = 0; i < n; ++i) bytes[i] = uint8_t(i * 131 + (i >> 7));
    EXPECT_EQ(to_hex(sha256(bytes.data(), n)), sha256_of(bytes)) << n;
  }
  RgbImage a{2, 3, std::vector<uint8_t>(18, 7)}, b{3, 2, std::vector<uint8_t>(18, 7)};
  EXPECT_NE(picture_digest(a), picture_digest(b));
  EXPECT_EQ(picture_digest(a), picture_digest(RgbImage{2, 3, std::vector<uint8_t>(18, 7)}));
}

// The tower's cache: least recently used out first, within its byte budget.
TEST(VisionEmbeddingCache, KeepsTheMostRecentPicturesWithinItsBytes) {
  auto picture = [](size_t floats) {
    return std::make_shared<const PictureEmbeddings>(PictureEmbeddings{{504, false, std::vector<float>(floats, 1.0f)}});
  };
  auto key = [](uint8_t k) { return sha256(&k, 1); };
  EmbeddingCache cache(3000);  // bytes: three pictures of 250 floats
  for (uint8_t k = 0; k < 3; ++k) cache.put(key(k), picture(250));
  EXPECT_EQ(cache.bytes(), 3000u);
  EXPECT_NE(cache.find(key(0)), nullptr);  // 0 is now the most recent
  cache.put(key(3), picture(250));         // 1 goes
  EXPECT_EQ(cache.find(key(1)), nullptr);
  EXPECT_NE(cache.find(key(0)), nullptr);
  EXPECT_NE(cache.find(key(2)), nullptr);
  EXPECT_NE(cache.find(key(3)), nullptr);
  cache.put(key(4), picture(1000));        // larger than the whole budget: not kept
  EXPECT_EQ(cache.find(key(4)), nullptr);
  EXPECT_EQ(cache.bytes(), 3000u);
  EXPECT_EQ(cache.hits(), 4u);
  EXPECT_EQ(cache.misses(), 2u);
}

TEST(VisionDecode, BadBytesAreClearErrors) {
  auto error_of = [](const std::vector<uint8_t>& bytes, const DecodeLimits& limits = {}) -> std::string {
    try {
      decode_image(bytes.data(), bytes.size(), limits);
    } catch (const ImageError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of({}).find("empty"), std::string::npos);
  EXPECT_NE(error_of({'h', 'e', 'l', 'l', 'o'}).find("cannot be decoded"), std::string::npos);
  std::vector<uint8_t> png = read_bytes(vision_dir() + "/images/square-300.png");
  const std::vector<uint8_t> truncated(png.begin(), png.begin() + long(png.size() / 3));
  EXPECT_NE(error_of(truncated).find("cannot be decoded"), std::string::npos);
  // A header that declares more pixels than allowed is refused before decoding.
  DecodeLimits small;
  small.max_pixels = 300 * 299;
  EXPECT_NE(error_of(png, small).find("too large: 300x300"), std::string::npos);
  // PNG headers alone (no pixel data) claiming a decompression bomb's size: refused from the
  // header, before anything is allocated: 10000^2 by our limit, 100000^2 already by stb's.
  for (const uint32_t side : {10000u, 100000u}) {
    std::vector<uint8_t> bomb(png.begin(), png.begin() + 33);
    for (int i = 0; i < 4; ++i) bomb[size_t(16 + i)] = bomb[size_t(20 + i)] = uint8_t(side >> (24 - 8 * i));
    const std::string e = error_of(bomb);
    EXPECT_TRUE(side == 10000u ? e.find("too large: 10000x10000") != std::string::npos
                               : e.find("cannot be decoded") != std::string::npos)
        << e;
  }
}

struct GoldenCase {
  std::string name;
  json g;
};

std::vector<GoldenCase> golden_cases() {
  std::vector<GoldenCase> cases;
  const json m = manifest();
  for (const auto& [name, entry] : m["goldens"].items())
    cases.push_back({name, read_json(vision_dir() + "/golden/" + entry["json"].get<std::string>())});
  return cases;
}

TEST(VisionStep3vl, GeometryAndTokenLayoutAreLlamaCpps) {
  const Step3vlConfig cfg = tiny_config();
  auto text_model = gguf::File::open(vision_dir() + "/models/tiny-v-f32.gguf");
  auto tok = Tokenizer::from_gguf(*text_model);
  const std::vector<GoldenCase> cases = golden_cases();
  ASSERT_GE(cases.size(), 7u);
  for (const GoldenCase& c : cases) {
    SCOPED_TRACE(c.name);
    const json& g = c.g;
    std::vector<Step3vlPlan> plans;
    for (size_t i = 0; i < g["images"].size(); ++i) {
      const RgbImage img = decode_file(vision_dir() + "/images/" + g["images"][i]["file"].get<std::string>());
      plans.push_back(plan_step3vl(img.nx, img.ny, cfg));
      const json& geo = g["image_geometry"][i];
      const Step3vlPlan& p = plans.back();
      EXPECT_EQ(p.grid_cols, geo["grid_cols"].get<int>());
      EXPECT_EQ(p.grid_rows, geo["grid_rows"].get<int>());
      ASSERT_EQ(p.slices.size(), geo["slices"].size());
      for (size_t s = 0; s < p.slices.size(); ++s) {
        EXPECT_EQ(p.slices[s].row, geo["slices"][s]["row"].get<int>());
        EXPECT_EQ(p.slices[s].col, geo["slices"][s]["col"].get<int>());
        EXPECT_EQ(p.slice_tokens_side, geo["slices"][s]["tokens_x"].get<int>());
        EXPECT_EQ(cfg.slice_size, geo["slices"][s]["nx"].get<int>());
      }
      EXPECT_EQ(p.overview_tokens_side, geo["overview"]["tokens_x"].get<int>());
      EXPECT_EQ(cfg.image_size, geo["overview"]["nx"].get<int>());
    }
    // The prompt with each media marker replaced by its picture's layout, tokenized as the
    // goldens were (BOS added, special tokens parsed); -1 at every image position.
    const std::string prompt = g["prompt"], marker = g["media_marker"];
    std::vector<int32_t> layout;
    std::string pending;
    size_t at = 0, image = 0;
    auto flush = [&] {
      const auto ids = tok->encode(pending, layout.empty(), true);
      layout.insert(layout.end(), ids.begin(), ids.end());
      pending.clear();
    };
    for (size_t m = prompt.find(marker); m != std::string::npos; m = prompt.find(marker, at)) {
      pending += prompt.substr(at, m - at);
      at = m + marker.size();
      for (const LayoutPiece& piece : step3vl_layout(plans[image])) {
        if (piece.chunk < 0) {
          pending += piece.text;
          continue;
        }
        flush();
        const bool overview = piece.chunk == int32_t(plans[image].slices.size());
        const int32_t side = overview ? plans[image].overview_tokens_side : plans[image].slice_tokens_side;
        layout.insert(layout.end(), size_t(side) * size_t(side), -1);
      }
      ++image;
    }
    pending += prompt.substr(at);
    flush();
    EXPECT_EQ(layout, g["token_layout"].get<std::vector<int32_t>>());
  }
}

TEST(VisionStep3vl, NormalisedPixelsAreLlamaCpps) {
  const Step3vlConfig cfg = tiny_config();
  for (const GoldenCase& c : golden_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<PreparedChunk> chunks;
    for (const auto& image : c.g["images"]) {
      const RgbImage img = decode_file(vision_dir() + "/images/" + image["file"].get<std::string>());
      auto more = prepare_step3vl(img, plan_step3vl(img.nx, img.ny, cfg), cfg);
      for (auto& ch : more) chunks.push_back(std::move(ch));
    }
    size_t k = 0;
    for (const auto& chunk : c.g["chunks"]) {
      if (chunk["type"] != "image") continue;
      ASSERT_LT(k, chunks.size());
      const PreparedChunk& ch = chunks[k++];
      SCOPED_TRACE("image chunk " + std::to_string(k - 1));
      ASSERT_EQ(ch.side, chunk["input_nx"].get<int>());
      EXPECT_EQ(ch.tokens_side, chunk["tokens_x"].get<int>());
      const json& st = chunk["input_stats"];
      double mn = 1e30, mx = -1e30;
      for (int ch_i = 0; ch_i < 3; ++ch_i) {
        double sum = 0, sumsq = 0;
        for (int32_t y = 0; y < ch.side; ++y)
          for (int32_t x = 0; x < ch.side; ++x) {
            const double v = ch.at(x, y, ch_i);
            sum += v, sumsq += v * v, mn = std::min(mn, v), mx = std::max(mx, v);
          }
        const double want_sum = st["sum"][ch_i], want_sumsq = st["sumsq"][ch_i];
        EXPECT_NEAR(sum, want_sum, 1e-6 * std::max(1.0, std::fabs(want_sum)) + 1e-3) << "channel " << ch_i;
        EXPECT_NEAR(sumsq, want_sumsq, 1e-6 * std::max(1.0, want_sumsq) + 1e-3) << "channel " << ch_i;
      }
      EXPECT_FLOAT_EQ(float(mn), st["min"].get<float>());
      EXPECT_FLOAT_EQ(float(mx), st["max"].get<float>());
      for (const auto& [key, value] : st["samples_x_y_c"].items()) {
        int x = 0, y = 0, cc = 0;
        ASSERT_EQ(std::sscanf(key.c_str(), "%d,%d,%d", &x, &y, &cc), 3);
        EXPECT_EQ(ch.at(x, y, cc), value.get<float>()) << key;
      }
    }
    EXPECT_EQ(k, chunks.size());
  }
}

TEST(VisionStep3vl, PlansOfOddShapes) {
  Step3vlConfig cfg;  // the released tower: 728 overview, 3024 longest side
  // A 1x1 picture: an overview only.
  Step3vlPlan p = plan_step3vl(1, 1, cfg);
  EXPECT_TRUE(p.slices.empty());
  EXPECT_EQ(p.n_image_tokens(), 13 * 13);
  // A huge panorama: limited to 3024 on its longest side, then cut into windows.
  p = plan_step3vl(20000, 1000, cfg);
  EXPECT_EQ(p.nx, 3024);
  EXPECT_EQ(p.ny, 151);
  EXPECT_GT(p.grid_cols, 1);
  for (const SliceCrop& s : p.slices) EXPECT_LE(s.x0 + p.window, p.crop_nx);
  // A thin vertical strip is pasted on a square.
  p = plan_step3vl(10, 400, cfg);
  EXPECT_TRUE(p.pasted_on_square);
  EXPECT_EQ(p.nx, 400);
  EXPECT_THROW(plan_step3vl(0, 10, cfg), ImageError);
}

}  // namespace
