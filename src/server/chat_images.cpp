#include "server/chat_images.h"

#include <chrono>
#include <cstring>
#include <mutex>

#include "server/api_error.h"
#include "server/image_fetch.h"
#include "server/server_context.h"
#include "vision/image_prompt.h"

namespace step35::server {

using nlohmann::ordered_json;

namespace {

bool is_image_part(const ordered_json& part) {
  return part.is_object() && part.contains("type") && part["type"] == "image_url";
}

// RFC 4648 base64 (standard alphabet, padding optional); line breaks and spaces, which
// some clients wrap long data URLs with, are skipped. nullopt for any other character.
std::optional<std::vector<uint8_t>> base64_decode(std::string_view s) {
  std::vector<uint8_t> out;
  out.reserve(s.size() / 4 * 3 + 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t pad = 0;
  for (char c : s) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else if (c == '=') { ++pad; continue; }
    else if (c == '\n' || c == '\r' || c == ' ' || c == '\t') continue;
    else return std::nullopt;
    if (pad) return std::nullopt;  // data after padding
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t(acc >> bits));
    }
  }
  if (pad > 2 || bits >= 6) return std::nullopt;  // a lone trailing character holds no byte
  return out;
}

// The URL of an image_url part: {"url": ...} (OpenAI) or the string itself (some clients).
std::string part_url(const ordered_json& part, const std::string& where) {
  if (!part.contains("image_url"))
    throw ApiError(400, "'" + where + ".image_url' is required for an image_url part", where + ".image_url");
  const ordered_json& iu = part["image_url"];
  if (iu.is_string()) return iu.get<std::string>();
  if (iu.is_object() && iu.contains("url") && iu["url"].is_string()) return iu["url"].get<std::string>();
  throw ApiError(400, "'" + where + ".image_url' must be {\"url\": \"data:...\"}", where + ".image_url");
}

}  // namespace

vision::RgbImage picture_from_url(const std::string& url, const std::string& param, const vision::DecodeLimits& limits,
                                  const ImageFetchOptions& fetch) {
  std::vector<uint8_t> bytes;
  if (is_fetched_url(url)) {
    bytes = fetch_picture_bytes(url, fetch, param);
  } else {
    const size_t comma = url.find(',');
    const std::string_view head = std::string_view(url).substr(0, comma == std::string::npos ? 0 : comma);
    if (url.rfind("data:", 0) != 0 || comma == std::string::npos)
      throw ApiError(400, "'" + param + "': a picture is a base64 data: URL (data:image/png;base64,...)" +
                     std::string(fetch.allow ? " or an http(s) URL" : ""), param);
    if (head.size() < 7 || head.substr(head.size() - 7) != ";base64")
      throw ApiError(400, "'" + param + "': the data: URL must be base64-encoded (data:<type>;base64,<bytes>)", param);
    auto decoded = base64_decode(std::string_view(url).substr(comma + 1));
    if (!decoded) throw ApiError(400, "'" + param + "': the data: URL's payload is not valid base64", param);
    bytes = std::move(*decoded);
  }
  try {
    return vision::decode_image(bytes.data(), bytes.size(), limits);
  } catch (const vision::ImageError& e) {
    throw ApiError(400, "'" + param + "': " + e.what(), param);
  }
}

namespace {

// The id standing at position k of a picture: negative (never a vocabulary id), below -1
// (-1 is the forward pass's "take the given row"), 30 bits mixed from the picture's digest
// (SHA-256: one client cannot make a picture whose positions pass for another's).
int32_t picture_token(const vision::Digest& digest, uint64_t k) {
  uint64_t key = 0;
  std::memcpy(&key, digest.data(), sizeof key);
  uint64_t x = key ^ (k * 0xD6E8FEB86659FD93ull);
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return -2 - int32_t(x & 0x3FFFFFFF);
}

}  // namespace

bool has_image_parts(const ordered_json& messages) {
  if (!messages.is_array()) return false;
  for (const ordered_json& m : messages) {
    if (!m.is_object() || !m.contains("content") || !m["content"].is_array()) continue;
    for (const ordered_json& part : m["content"])
      if (is_image_part(part)) return true;
  }
  return false;
}

std::vector<vision::RgbImage> take_chat_images(const ServerContext& ctx, ordered_json& messages) {
  std::vector<vision::RgbImage> images;
  for (size_t i = 0; i < messages.size(); ++i) {
    ordered_json& m = messages[i];
    if (!m.is_object() || !m.contains("content") || !m["content"].is_array()) continue;
    for (size_t k = 0; k < m["content"].size(); ++k) {
      ordered_json& part = m["content"][k];
      if (!is_image_part(part)) continue;
      const std::string where = "messages[" + std::to_string(i) + "].content[" + std::to_string(k) + "]";
      if (!ctx.mmproj)
        throw ApiError(400, "'" + where + "': this server reads text only; start it with --mmproj (the model's "
                       "vision tower, a step3vl mmproj GGUF) to send pictures", where);
      images.push_back(picture_from_url(part_url(part, where), where + ".image_url.url", {}, ctx.options.image_fetch));
      part = ordered_json{{"type", "text"}, {"text", std::string(vision::kMediaMarker)}};
    }
  }
  return images;
}

void tokenize_with_images(ServerContext& ctx, const std::string& text, bool add_bos,
                          const std::vector<vision::RgbImage>& images, GenerateRequest& request) {
  vision::ImagePrompt ip;
  const int32_t n_embd = ctx.model->hparams().n_embd;
  try {
    // One picture encoded at a time: the tower's pool is shared.
    std::lock_guard<std::mutex> lock(ctx.vision_mu);
    ip = vision::build_image_prompt(text, images, *ctx.mmproj, ctx.tokenizer(), n_embd, *ctx.vision_pool, add_bos,
                                    vision::kMediaMarker, ctx.image_cache.get());
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, std::string("'messages': ") + e.what(), "messages");
  }
  ctx.metrics.count_images(images.size(), size_t(ip.n_encoded), ip.encode_ms);
  // The -1 positions come chunk by chunk in prompt order; number them within each picture.
  std::vector<uint64_t> seen(images.size(), 0);
  size_t chunk = 0, left = 0;
  for (int32_t& t : ip.tokens) {
    if (t != -1) continue;
    while (left == 0) left = size_t(ip.chunks[chunk++].n_tokens);
    const size_t img = size_t(ip.chunks[chunk - 1].image);
    t = picture_token(ip.digests[img], seen[img]++);
    --left;
  }
  auto rows = std::make_shared<PromptEmbeddings>();
  rows->n_embd = n_embd;
  rows->rows = std::move(ip.image_embeddings);
  request.prompt = std::move(ip.tokens);
  request.embeddings = std::move(rows);
}

nlohmann::json image_url_part(const std::string& url) {
  return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}

}  // namespace step35::server
