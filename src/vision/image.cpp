#include "vision/image.h"

#include <stb_image.h>

#include <climits>
#include <cstring>

namespace step35::vision {

namespace {

// Whether every chunk of a PNG lies inside the bytes. stb_image grows its buffer for the
// compressed data by the lengths the chunk headers declare before it reads them, so a
// 100-byte file declaring a 2 GB chunk costs a 2 GB allocation (found by fuzz_image).
bool png_chunks_fit(const uint8_t* data, size_t size) {
  static const uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size < 8 || std::memcmp(data, kSignature, 8) != 0) return true;  // not a PNG
  size_t at = 8;
  while (at + 12 <= size) {
    const size_t len = size_t(data[at]) << 24 | size_t(data[at + 1]) << 16 | size_t(data[at + 2]) << 8 | data[at + 3];
    if (len > size - at - 12) return false;
    const bool end = std::memcmp(data + at + 4, "IEND", 4) == 0;
    at += 12 + len;
    if (end) return true;
  }
  return false;
}

}  // namespace

RgbImage decode_image(const uint8_t* data, size_t size, const DecodeLimits& limits) {
  if (size == 0) throw ImageError("the image is empty (0 bytes)");
  if (size > size_t(INT_MAX)) throw ImageError("the image is larger than 2 GiB");
  int nx = 0, ny = 0, channels = 0;
  // The header first: dimensions without decoding, so an oversize picture is refused before
  // anything is allocated for it.
  if (!stbi_info_from_memory(data, int(size), &nx, &ny, &channels))
    throw ImageError(std::string("the image cannot be decoded (") + stbi_failure_reason() +
                     "); PNG, JPEG, BMP and GIF are supported");
  if (nx <= 0 || ny <= 0) throw ImageError("the image has no pixels (" + std::to_string(nx) + "x" + std::to_string(ny) + ")");
  if (nx > limits.max_side || ny > limits.max_side || int64_t(nx) * int64_t(ny) > limits.max_pixels)
    throw ImageError("the image is too large: " + std::to_string(nx) + "x" + std::to_string(ny) + " pixels (at most " +
                     std::to_string(limits.max_side) + " per side and " + std::to_string(limits.max_pixels) +
                     " in all)");
  if (!png_chunks_fit(data, size))
    throw ImageError("the image cannot be decoded (a PNG chunk runs past the end: truncated or corrupt)");
  int dx = 0, dy = 0, dc = 0;
  stbi_uc* pixels = stbi_load_from_memory(data, int(size), &dx, &dy, &dc, 3);
  if (!pixels) throw ImageError(std::string("the image cannot be decoded (") + stbi_failure_reason() + ")");
  RgbImage img;
  img.nx = dx;
  img.ny = dy;
  img.rgb.assign(pixels, pixels + size_t(dx) * size_t(dy) * 3);
  stbi_image_free(pixels);
  if (dx != nx || dy != ny) throw ImageError("the image's header and its pixels disagree on its size");
  return img;
}

}  // namespace step35::vision
