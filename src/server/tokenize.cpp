// POST /tokenize and POST /detokenize: the model's tokenizer over HTTP (llama-server's
// field names: content / add_special / parse_special / with_pieces, tokens / special).
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/chat_plan.h"
#include "server/request_validation.h"
#include "server/server_context.h"

namespace step35::server {

using nlohmann::json;

json tokenize_response(const ServerContext& ctx, const json& body) {
  Fields f(body);
  f.only({"content", "add_special", "parse_special", "with_pieces", "model"});
  const auto content = f.string("content");
  if (!content) throw ApiError(400, "'content' is required", "content");
  const Tokenizer& tok = ctx.tokenizer();
  const auto ids = tok.encode(*content, f.boolean("add_special").value_or(true), f.boolean("parse_special").value_or(false));
  json out = {{"tokens", ids}, {"count", ids.size()}};
  if (f.boolean("with_pieces").value_or(false)) {
    json pieces = json::array();
    for (int32_t t : ids) pieces.push_back({{"id", t}, {"piece", tok.token_to_piece(t, true)}});
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
