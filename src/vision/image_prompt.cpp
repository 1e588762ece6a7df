#include "vision/image_prompt.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
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

namespace {

void check_prompt(std::string_view prompt, size_t n_images, const Tokenizer& tok, std::string_view marker) {
  for (const char* t : {"<im_start>", "<im_end>", "<patch_start>", "<patch_end>", "<patch_newline>"})
    if (tok.find_token(t) < 0)
      throw std::invalid_argument(std::string("the model's vocabulary has no ") + t +
                                  " token: it is not a Step-3.7 text model, images cannot be placed");
  size_t n_markers = 0;
  for (size_t at = prompt.find(marker); at != std::string_view::npos; at = prompt.find(marker, at + marker.size()))
    ++n_markers;
  if (n_markers != n_images)
    throw std::invalid_argument("the prompt holds " + std::to_string(n_markers) + " media marker" +
                                (n_markers == 1 ? "" : "s") + " (" + std::string(marker) + ") for " +
                                std::to_string(n_images) + " image" + (n_images == 1 ? "" : "s"));
}

// Where a picture's chunk rows come from: the tower (or the cache, by the picture's digest,
// which the source appends to `digests`), or nowhere when only the layout is wanted (null:
// the chunks' sizes then come from the plan, and no digest is computed).
using ChunkSource = std::function<std::shared_ptr<const PictureEmbeddings>(size_t image, const Step3vlPlan& plan,
                                                                           std::vector<Digest>& digests)>;

// The prompt's tokens around the markers, each picture's layout in its marker's place, and
// its chunks' rows (when the source gives them) at the -1 positions.
ImagePrompt assemble(std::string_view prompt, const std::vector<RgbImage>& images, const Step3vlConfig& cfg,
                     const Tokenizer& tok, int32_t n_embd, bool add_bos, std::string_view marker,
                     const ChunkSource& source) {
  ImagePrompt out;
  out.n_embd = n_embd;
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
    const Step3vlPlan plan = plan_step3vl(images[i].nx, images[i].ny, cfg);
    const std::shared_ptr<const PictureEmbeddings> chunks = source(i, plan, out.digests);
    for (const LayoutPiece& piece : step3vl_layout(plan)) {
      if (piece.chunk < 0) {
        pending += piece.text;
        continue;
      }
      flush();
      const bool overview = size_t(piece.chunk) >= plan.slices.size();
      const int32_t tokens_side = overview ? plan.overview_tokens_side : plan.slice_tokens_side;
      ImagePrompt::Chunk chunk{int32_t(i), 0, 0, tokens_side * tokens_side, overview};
      chunk.nx = chunk.ny = overview ? cfg.image_size : cfg.slice_size;
      if (chunks) {
        const ChunkEmbeddings& ch = (*chunks)[size_t(piece.chunk)];
        chunk = {int32_t(i), ch.side, ch.side, int32_t(ch.rows.size() / size_t(n_embd)), ch.overview};
        out.image_embeddings.insert(out.image_embeddings.end(), ch.rows.begin(), ch.rows.end());
      }
      out.tokens.insert(out.tokens.end(), size_t(chunk.n_tokens), -1);
      out.chunks.push_back(chunk);
    }
    out.plans.push_back(plan);
  }
  pending += prompt.substr(at);
  if (!pending.empty() || out.tokens.empty()) flush();
  return out;
}

}  // namespace

ImagePrompt build_image_prompt(std::string_view prompt, const std::vector<RgbImage>& images,
                               const Step3vlEncoder& encoder, const Tokenizer& tok, int32_t n_embd, ThreadPool& pool,
                               bool add_bos, std::string_view marker, EmbeddingCache* cache) {
  if (encoder.projection_dim() != n_embd)
    throw std::invalid_argument("the vision tower projects to " + std::to_string(encoder.projection_dim()) +
                                " dimensions, the text model's embedding has " + std::to_string(n_embd));
  check_prompt(prompt, images.size(), tok, marker);
  const auto t0 = std::chrono::steady_clock::now();
  int32_t n_encoded = 0;
  ImagePrompt out = assemble(prompt, images, encoder.config(), tok, n_embd, add_bos, marker,
                             [&](size_t i, const Step3vlPlan& plan, std::vector<Digest>& digests) {
                               const Digest& digest = digests.emplace_back(picture_digest(images[i]));
                               std::shared_ptr<const PictureEmbeddings> chunks = cache ? cache->find(digest) : nullptr;
                               if (!chunks) {
                                 chunks = std::make_shared<const PictureEmbeddings>(
                                     encode_picture(images[i], plan, encoder, pool));
                                 ++n_encoded;
                                 if (cache) cache->put(digest, chunks);
                               }
                               return chunks;
                             });
  out.n_encoded = n_encoded;
  out.encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

ImagePrompt image_prompt_layout(std::string_view prompt, const std::vector<RgbImage>& images,
                                const Step3vlConfig& cfg, const Tokenizer& tok, bool add_bos, std::string_view marker) {
  check_prompt(prompt, images.size(), tok, marker);
  const ChunkSource layout_only = [](size_t, const Step3vlPlan&, std::vector<Digest>&) { return nullptr; };
  return assemble(prompt, images, cfg, tok, 0, add_bos, marker, layout_only);
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
