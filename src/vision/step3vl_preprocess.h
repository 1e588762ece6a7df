// The step3vl vision tower's picture preparation (docs/vision.md "Preprocessing"), as llama.cpp
// builds it: how a picture is cut into slices plus an overview (the plan: sizes only), the
// pixels of each (8-bit resizes as Pillow's BILINEAR, then a plain F32 bilinear sample with
// normalisation), and the text around them (`<patch_start>` slice `<patch_end>` ...,
// `<im_start>` overview `<im_end>`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vision/image.h"

namespace step35::gguf {
class File;
}

namespace step35::vision {

struct Step3vlConfig {
  int32_t image_size = 728;          // clip.vision.image_size: the overview's side in pixels
  int32_t patch_size = 14;           // clip.vision.patch_size
  int32_t preproc_image_size = 3024; // clip.vision.preproc_image_size: the longest side kept
  int32_t slice_size = 504;          // a slice's side (a constant of llama.cpp, not a key)
  int32_t merge = 4;                 // the two stride-2 convolutions: 4x4 patches per token
  float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};  // clip.vision.image_mean
  float std[3] = {0.26862954f, 0.26130258f, 0.27577711f};  // clip.vision.image_std
  // The tokens along one side of a square input of `side` pixels.
  int32_t tokens_per_side(int32_t side) const { return side / patch_size / merge; }
};

// The config of an mmproj file's keys; throws std::invalid_argument for sizes the tower cannot
// take (image_size and 504 must be multiples of patch_size * merge).
Step3vlConfig step3vl_config(const gguf::File& mmproj);

// One window-sized crop of the (refined) picture: its top-left corner, its grid cell.
struct SliceCrop {
  int32_t x0 = 0, y0 = 0, row = 0, col = 0;
};

struct Step3vlPlan {
  int32_t src_nx = 0, src_ny = 0;          // the decoded picture
  bool pasted_on_square = false;           // a thin strip, pasted top-left on a black square
  int32_t square_side = 0;                 // its side when pasted
  int32_t nx = 0, ny = 0;                  // after the longest-side limit: the overview's source
  int32_t window = 0;                      // a slice's side in the picture; 0: no slices
  int32_t crop_nx = 0, crop_ny = 0;        // the picture resized to whole windows (slices' source)
  int32_t grid_cols = 0, grid_rows = 0;    // 0 x 0 without slices
  std::vector<SliceCrop> slices;           // row-major
  int32_t slice_tokens_side = 0, overview_tokens_side = 0;
  int64_t n_image_tokens() const {
    return int64_t(slices.size()) * slice_tokens_side * slice_tokens_side +
           int64_t(overview_tokens_side) * overview_tokens_side;
  }
};

Step3vlPlan plan_step3vl(int32_t nx, int32_t ny, const Step3vlConfig& cfg);

// One chunk the encoder takes: a square of normalised pixels, channel-planar ([3][side][side],
// x fastest), and the tokens it becomes along each side.
struct PreparedChunk {
  int32_t side = 0;
  int32_t tokens_side = 0;
  bool overview = false;
  int32_t row = 0, col = 0;  // a slice's grid cell
  std::vector<float> pixels;
  float at(int32_t x, int32_t y, int c) const { return pixels[(size_t(c) * size_t(side) + size_t(y)) * size_t(side) + size_t(x)]; }
};

// The slices in plan order, then the overview.
std::vector<PreparedChunk> prepare_step3vl(const RgbImage& img, const Step3vlPlan& plan, const Step3vlConfig& cfg);

// The text and image pieces that stand in for one picture in the prompt, in order: a piece is
// either text (special tokens, tokenized with the prompt) or the index of a prepared chunk.
struct LayoutPiece {
  std::string text;     // when chunk < 0
  int32_t chunk = -1;   // index into prepare_step3vl's chunks
};
std::vector<LayoutPiece> step3vl_layout(const Step3vlPlan& plan);

// Pillow's BILINEAR resize of 8-bit RGB (separable, support widened when shrinking, 22-bit
// fixed-point coefficients), which llama.cpp's img_tool::resize reproduces.
RgbImage resize_bilinear_u8(const RgbImage& img, int32_t nx, int32_t ny);

}  // namespace step35::vision
