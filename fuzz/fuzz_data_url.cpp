// libFuzzer target: arbitrary bytes as the URL of an image_url part (the base64 data: URLs
// a client sends to `step35 serve --mmproj`), through the URL check, base64 decoding and
// stb_image. Built by CMake with -DSTEP35_FUZZ=ON (see fuzz/run.sh).
// Checked besides "no crash, no UB, no hang, no allocation beyond the limits": the answer
// is a picture of the size it declares, or an ApiError with status 400 naming the part;
// nothing else escapes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "server/api_error.h"
#include "server/chat_images.h"

using namespace step35;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string url(reinterpret_cast<const char*>(data), size);
  vision::DecodeLimits limits;
  limits.max_pixels = 1 << 20;  // keeps each run short; the limit's own check is what is fuzzed
  limits.max_side = 4096;
  try {
    const vision::RgbImage img = server::picture_from_url(url, "messages[0].content[0]", limits);
    if (img.nx <= 0 || img.ny <= 0 || int64_t(img.nx) * img.ny > limits.max_pixels ||
        img.rgb.size() != size_t(img.nx) * size_t(img.ny) * 3) {
      std::fprintf(stderr, "fuzz_data_url: bad picture size\n");
      std::abort();
    }
  } catch (const server::ApiError& e) {
    if (e.status() != 400 || std::string(e.what()).find("messages[0].content[0]") == std::string::npos) {
      std::fprintf(stderr, "fuzz_data_url: unexpected error: %d %s\n", e.status(), e.what());
      std::abort();
    }
  }
  return 0;
}
