// POST /tokenize and POST /detokenize: the model's tokenizer over HTTP (llama-server's
// field names: content / add_special / parse_special / with_pieces, tokens / special). With
// --mmproj, /tokenize's content may also be llama-server's multimodal prompt object, so a
// client can count what a prompt with pictures takes of the context.
#include <algorithm>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/chat_images.h"
#include "server/image_fetch.h"
#include "server/chat_plan.h"
#include "server/request_validation.h"
#include "server/server_context.h"
#include "vision/image_prompt.h"

namespace step35::server {

using nlohmann::json;

namespace {

// llama-server's multimodal prompt object as /tokenize's content: {"prompt_string": text
// with one media marker per picture, "multimodal_data": [base64 bytes or a URL, ...]}. The
// pictures are decoded and laid out, not encoded: each position a picture takes is -1.
std::vector<int32_t> tokenize_with_pictures(const ServerContext& ctx, const json& content, bool add_special) {
  Fields c(content, "content.");
  c.only({"prompt_string", "multimodal_data"});
  const auto text = c.string("prompt_string");
  if (!text) throw ApiError(400, "'content.prompt_string' is required", "content.prompt_string");
  const json* data = c.array("multimodal_data");
  std::vector<vision::RgbImage> pictures;
  for (size_t k = 0; data && k < data->size(); ++k) {
    const std::string param = "content.multimodal_data[" + std::to_string(k) + "]";
    if (!ctx.mmproj)
      throw ApiError(400, "'" + param + "': this server reads text only; start it with --mmproj to send pictures",
                     param);
    if (!(*data)[k].is_string()) throw ApiError(400, "'" + param + "' must be a string", param);
    const std::string s = (*data)[k].get<std::string>();
    const bool url = s.rfind("data:", 0) == 0 || is_fetched_url(s);
    pictures.push_back(picture_from_url(url ? s : "data:application/octet-stream;base64," + s, param, {},
                                        ctx.options.image_fetch));
  }
  if (pictures.empty()) return ctx.tokenizer().encode(*text, add_special, true);
  try {
    return vision::image_prompt_layout(*text, pictures, ctx.mmproj->config(), ctx.tokenizer(), add_special).tokens;
  } catch (const std::invalid_argument& e) {
    throw ApiError(400, std::string("'content': ") + e.what(), "content");
  }
}

}  // namespace

json tokenize_response(const ServerContext& ctx, const json& body) {
  Fields f(body);
  f.only({"content", "add_special", "parse_special", "with_pieces", "model"});
  const bool add_special = f.boolean("add_special").value_or(true);
  std::vector<int32_t> ids;
  if (f.has("content") && f.raw("content").is_object()) {
    ids = tokenize_with_pictures(ctx, f.raw("content"), add_special);
  } else {
    const auto text = f.string("content");
    if (!text) throw ApiError(400, "'content' is required", "content");
    ids = ctx.tokenizer().encode(*text, add_special, f.boolean("parse_special").value_or(false));
  }
  const Tokenizer& tok = ctx.tokenizer();
  json out = {{"tokens", ids}, {"count", ids.size()}};
  const auto n_picture = std::count(ids.begin(), ids.end(), -1);
  if (n_picture > 0) out["image_tokens"] = n_picture;
  if (f.boolean("with_pieces").value_or(false)) {
    json pieces = json::array();
    for (int32_t t : ids) pieces.push_back({{"id", t}, {"piece", t < 0 ? std::string() : tok.token_to_piece(t, true)}});
    out["pieces"] = pieces;
  }
  return out;
}

json detokenize_response(const ServerContext& ctx, const json& body) {
  Fields f(body);
  f.only({"tokens", "special", "model"});
  const json* tokens = f.array("tokens");
  if (!tokens) throw ApiError(400, "'tokens' is required", "tokens");
  const Tokenizer& tok = ctx.tokenizer();
  std::vector<int32_t> ids;
  for (const json& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= int64_t(tok.n_vocab()))
      throw ApiError(400, "'tokens' must hold token ids in [0, " + std::to_string(tok.n_vocab()) + ")", "tokens");
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  return {{"content", tok.decode(ids, f.boolean("special").value_or(true))}};
}

}  // namespace step35::server
