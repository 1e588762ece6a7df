// A picture's identity for caches: SHA-256 over its size and RGB bytes. Cryptographic on
// purpose: the server's caches are shared by every client, and one client must not be able
// to make a picture that takes another's place.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "vision/image.h"

namespace step35::vision {

using Digest = std::array<uint8_t, 32>;

// SHA-256 (FIPS 180-4) of `size` bytes.
Digest sha256(const uint8_t* data, size_t size);
// SHA-256 of the picture's width and height (4 bytes each, little endian) then its pixels.
Digest picture_digest(const RgbImage& image);
std::string to_hex(const Digest& d);

}  // namespace step35::vision
