// libFuzzer target: arbitrary bytes as a picture a client sent (an OpenAI image_url data:
// URL, an Anthropic image block), through stb_image decoding and the step3vl preparation.
// Built by CMake with -DSTEP35_FUZZ=ON (see fuzz/run.sh).
// Checked besides "no crash, no UB, no hang, no allocation beyond the limits":
//  - bad bytes are an ImageError, never anything else;
//  - a decoded picture has the declared size and 3 bytes per pixel;
//  - its plan's windows lie inside the refined picture and its chunks are as many as the
//    plan says, each of finite pixels.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "vision/image.h"
#include "vision/step3vl_preprocess.h"

using namespace step35::vision;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_image: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  DecodeLimits limits;
  limits.max_pixels = 1 << 20;  // keeps each run short; the limit's own check is what is fuzzed
  limits.max_side = 4096;
  RgbImage img;
  try {
    img = decode_image(data, size, limits);
  } catch (const ImageError&) {
    return 0;
  }
  if (img.nx <= 0 || img.ny <= 0 || img.rgb.size() != size_t(img.nx) * size_t(img.ny) * 3) fail("bad decoded size");
  Step3vlConfig cfg;  // small tower so preparation stays fast: 112 overview, 224 longest side
  cfg.image_size = 112;
  cfg.slice_size = 56;
  cfg.preproc_image_size = 224;
  const Step3vlPlan plan = plan_step3vl(img.nx, img.ny, cfg);
  for (const SliceCrop& s : plan.slices)
    if (s.x0 < 0 || s.y0 < 0 || s.x0 + std::min(plan.window, plan.crop_nx) > plan.crop_nx) fail("window outside the picture");
  const auto chunks = prepare_step3vl(img, plan, cfg);
  if (chunks.size() != plan.slices.size() + 1) fail("chunk count");
  for (const PreparedChunk& c : chunks)
    for (float v : c.pixels)
      if (!std::isfinite(v)) fail("non-finite pixel");
  return 0;
}
