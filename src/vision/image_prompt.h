// A prompt with pictures in it, as the text model takes it: the text around each media
// marker tokenized, each picture's layout (tokenized special tokens around its chunks) in
// place of its marker, and the chunks' embeddings at the positions of token id -1.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "vision/embedding_cache.h"
#include "vision/image.h"
#include "vision/picture_digest.h"
#include "vision/step3vl_encoder.h"
#include "vision/step3vl_preprocess.h"

namespace step35 {
class Tokenizer;
class ThreadPool;
}  // namespace step35

namespace step35::vision {

// llama.cpp's media marker (mtmd_default_marker()).
inline constexpr std::string_view kMediaMarker = "<__media__>";

struct ImagePrompt {
  std::vector<int32_t> tokens;      // -1 at every image position
  int32_t n_embd = 0;
  struct Chunk {
    int32_t image = 0, nx = 0, ny = 0, n_tokens = 0;
    bool overview = false;
  };
  std::vector<Step3vlPlan> plans;   // per picture
  std::vector<Digest> digests;      // per picture (picture_digest); none from image_prompt_layout
  int32_t n_encoded = 0;            // pictures that went through the tower (not in the cache)
  std::vector<Chunk> chunks;        // every image chunk, prompt order
  std::vector<float> image_embeddings;  // the chunks' rows, prompt order (one per -1 token)
  double encode_ms = 0;
  // One row of n_embd per token, zeros at text: what Session::forward takes.
  std::vector<float> dense_embeddings() const;
};

// Throws std::invalid_argument when the markers and the pictures do not pair up, when the
// vocabulary lacks the step3vl layout tokens, or when the tower's projection width is not
// `n_embd`. `cache` (optional): pictures found there are not encoded again, and those
// encoded are kept there.
ImagePrompt build_image_prompt(std::string_view prompt, const std::vector<RgbImage>& images,
                               const Step3vlEncoder& encoder, const Tokenizer& tok, int32_t n_embd, ThreadPool& pool,
                               bool add_bos = true, std::string_view marker = kMediaMarker,
                               EmbeddingCache* cache = nullptr);

// The same prompt's tokens (-1 at every image position), plans and chunks without going
// through the tower: what counting needs (/tokenize). image_embeddings stays empty.
ImagePrompt image_prompt_layout(std::string_view prompt, const std::vector<RgbImage>& images,
                                const Step3vlConfig& cfg, const Tokenizer& tok, bool add_bos = true,
                                std::string_view marker = kMediaMarker);

// One picture through the tower: prepared (step3vl_preprocess.h) and every chunk encoded.
PictureEmbeddings encode_picture(const RgbImage& image, const Step3vlPlan& plan, const Step3vlEncoder& encoder,
                                 ThreadPool& pool);

}  // namespace step35::vision
