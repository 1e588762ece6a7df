#include "vision/image.h"

#include <stb_image.h>

#include <climits>
#include <cstring>

namespace step35::vision {

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
