#include "vision/image_prompt.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "tokenizer/tokenizer.h"

namespace step35::vision {

PictureEmbeddings encode_picture(const RgbImage& image, const Step3vlPlan& plan, const Step3vlEncoder& encoder,
                                 ThreadPool& pool) {
  PictureEmbeddings out;
  for (const PreparedChunk& ch : prepare_step3vl(image, plan, encoder.config()))
    out.push_back({ch.side, ch.overview, encoder.encode(ch, pool)});
  return out;
}

ImagePrompt build_image_prompt(std::string_view prompt, const std::vector<RgbImage>& images,
                               const Step3vlEncoder& encoder, const Tokenizer& tok, int32_t n_embd, ThreadPool& pool,
                               bool add_bos, std::string_view marker, EmbeddingCache* cache) {
  if (encoder.projection_dim() != n_embd)
    throw std::invalid_argument("the vision tower projects to " + std::to_string(encoder.projection_dim()) +
                                " dimensions, the text model's embedding has " + std::to_string(n_embd));
  for (const char* t : {"<im_start>", "<im_end>", "<patch_start>", "<patch_end>", "<patch_newline>"})
    if (tok.find_token(t) < 0)
      throw std::invalid_argument(std::string("the model's vocabulary has no ") + t +
                                  " token: it is not a Step-3.7 text model, images cannot be placed");
  size_t n_markers = 0;
  for (size_t at = prompt.find(marker); at != std::string_view::npos; at = prompt.find(marker, at + marker.size()))
    ++n_markers;
  if (n_markers != images.size())
    throw std::invalid_argument("the prompt holds " + std::to_string(n_markers) + " media marker" +
                                (n_markers == 1 ? "" : "s") + " (" + std::string(marker) + ") for " +
                                std::to_string(images.size()) + " image" + (images.size() == 1 ? "" : "s"));
  ImagePrompt out;
  out.n_embd = n_embd;
  const auto t0 = std::chrono::steady_clock::now();
  std::string pending;
  auto flush = [&] {
    const auto ids = tok.encode(pending, add_bos && out.tokens.empty(), true);
    out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
    pending.clear();
  };
  size_t at = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const size_t m = prompt.find(marker, at);
    pending += prompt.substr(at, m - at);
    at = m + marker.size();
    const Step3vlPlan plan = plan_step3vl(images[i].nx, images[i].ny, encoder.config());
    out.digests.push_back(picture_digest(images[i]));
    std::shared_ptr<const PictureEmbeddings> chunks = cache ? cache->find(out.digests.back()) : nullptr;
    if (!chunks) {
      chunks = std::make_shared<const PictureEmbeddings>(encode_picture(images[i], plan, encoder, pool));
      ++out.n_encoded;
      if (cache) cache->put(out.digests.back(), chunks);
    }
    for (const LayoutPiece& piece : step3vl_layout(plan)) {
      if (piece.chunk < 0) {
        pending += piece.text;
        continue;
      }
      flush();
      const ChunkEmbeddings& ch = (*chunks)[size_t(piece.chunk)];
      const size_t n = ch.rows.size() / size_t(n_embd);
      out.tokens.insert(out.tokens.end(), n, -1);
      out.image_embeddings.insert(out.image_embeddings.end(), ch.rows.begin(), ch.rows.end());
      out.chunks.push_back({int32_t(i), ch.side, ch.side, int32_t(n), ch.overview});
    }
    out.plans.push_back(plan);
  }
  pending += prompt.substr(at);
  if (!pending.empty() || out.tokens.empty()) flush();
  out.encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::vector<float> ImagePrompt::dense_embeddings() const {
  const size_t E = size_t(n_embd);
  std::vector<float> dense(tokens.size() * E, 0.0f);
  size_t row = 0;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == -1) std::copy_n(image_embeddings.data() + row++ * E, E, dense.data() + i * E);
  return dense;
}

}  // namespace step35::vision
