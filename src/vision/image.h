// Pictures as the vision tower's preprocessing takes them: 8-bit RGB, decoded from the bytes a
// client sent with the decoder llama.cpp uses (stb_image, Debian's libstb), so that every pixel
// is the one llama.cpp sees (docs/vision.md).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace step35::vision {

// An image that cannot be used; the message names the reason in a client's terms.
struct ImageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Row-major 8-bit RGB, 3 bytes per pixel; nx columns, ny rows.
struct RgbImage {
  int32_t nx = 0, ny = 0;
  std::vector<uint8_t> rgb;
  uint8_t* at(int32_t x, int32_t y) { return rgb.data() + (size_t(y) * size_t(nx) + size_t(x)) * 3; }
  const uint8_t* at(int32_t x, int32_t y) const { return rgb.data() + (size_t(y) * size_t(nx) + size_t(x)) * 3; }
};

// What a decode may cost before it is refused, checked from the header alone, before any
// pixel memory is allocated (a few hundred bytes of PNG can declare gigapixels).
struct DecodeLimits {
  int64_t max_pixels = int64_t(1) << 26;  // 64 Mpx: 192 MiB of RGB
  int32_t max_side = 1 << 15;
};

// PNG (any bit depth: 16-bit keeps the high byte), JPEG (baseline and progressive), BMP, GIF
// (first frame), as stb_image decodes them; alpha is dropped, not composited (llama.cpp does
// the same). Throws ImageError for empty, truncated or corrupt bytes, unknown formats, zero or
// oversize dimensions.
RgbImage decode_image(const uint8_t* data, size_t size, const DecodeLimits& limits = {});

}  // namespace step35::vision
