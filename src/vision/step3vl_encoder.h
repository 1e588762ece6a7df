// The step3vl vision tower (docs/vision.md "The encoder"): an mmproj GGUF's weights and the
// forward pass from one prepared chunk's pixels to its embeddings in the text model's space.
// Patch embedding (14x14 convolution) + a learned position table (resized to the chunk's
// patch grid), pre-LayerNorm, ViT blocks with 2-D RoPE and layer scales, two 3x3 stride-2
// convolutions that merge 4x4 patches into one token, a linear projector.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"
#include "vision/step3vl_preprocess.h"

namespace step35 {
class ThreadPool;
namespace gguf {
class File;
}
}  // namespace step35

namespace step35::vision {

// Intermediates of one chunk (tests compare them with llama.cpp's): each [n_patches][width]
// but downsample_1, [channels][rows][cols].
struct EncoderTrace {
  std::vector<float> pos_embd_resized, pos_embed, vit_out, downsample_1;
};

class Step3vlEncoder {
 public:
  // Throws std::invalid_argument (one line, naming the file) for a file that is not a
  // step3vl mmproj we run: another projector type, missing or misshapen tensors, weight
  // types other than F32 / F16 / BF16 / Q8_0.
  static std::unique_ptr<Step3vlEncoder> load(const std::string& path);
  ~Step3vlEncoder();

  const Step3vlConfig& config() const { return cfg_; }
  const gguf::File& file() const { return *file_; }
  int32_t projection_dim() const { return proj_dim_; }  // the text model's embedding width
  int32_t width() const { return width_; }
  int32_t n_layers() const { return int32_t(blocks_.size()); }
  int32_t n_heads() const { return n_head_; }
  int64_t n_params() const { return n_params_; }

  // Embeddings of one chunk: tokens_side^2 rows of projection_dim floats, row-major.
  std::vector<float> encode(const PreparedChunk& chunk, ThreadPool& pool, EncoderTrace* trace = nullptr) const;

 private:
  struct Block {
    std::vector<float> ln1_w, ln1_b, qkv_b, out_b, ls1, ln2_w, ln2_b, up_b, down_b, ls2;
    WeightMatrix qkv, out, up, down;
  };
  Step3vlEncoder() = default;

  std::unique_ptr<gguf::File> file_;
  Step3vlConfig cfg_;
  int32_t width_ = 0, n_head_ = 0, n_ff_ = 0, proj_dim_ = 0, table_side_ = 0;
  float eps_ = 1e-5f;
  int64_t n_params_ = 0;
  WeightMatrix patch_embd_, conv0_, conv1_, fc_;
  std::vector<uint16_t> patch_f16_, conv0_f16_, conv1_f16_;  // F16 copies (llama.cpp's precision)
  std::vector<float> pos_table_;     // [table_side^2][width]
  std::vector<float> pre_ln_w_, pre_ln_b_, conv0_b_, conv1_b_;
  int32_t conv0_out_ = 0;
  std::vector<Block> blocks_;
};

}  // namespace step35::vision
