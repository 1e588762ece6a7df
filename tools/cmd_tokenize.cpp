// step35 tokenize: print the token ids of a text as a JSON list.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "args.h"
#include "commands.h"
#include "common.h"

namespace step35::cli {

static int tokenize_main(const Args& args) {
  ArgParser p("tokenize", "Prints the token ids of TEXT as a JSON list.");
  std::string model_path, text;
  bool add_bos = true, parse_special = false, pieces = false;
  p.option("-m,--model", "FILE", "GGUF model (its tokenizer)", model_path, "the built-in tiny model");
  p.option("-p,--prompt", "TEXT", "text to tokenize", text);
  p.option("--no-bos", "do not prepend BOS even if the vocabulary asks for it", add_bos, false);
  p.option("--parse-special", "turn control-token text such as <|im_start|> into its token", parse_special);
  p.option("--pieces", "print [[id, \"piece\"], ...] instead of bare ids", pieces);
  if (!p.parse(args)) return 0;
  if (!p.has("prompt")) throw UsageError("-p TEXT is required");
  const std::string path = p.has("model") ? model_path : builtin_tiny_model_path();
  auto model = load_model(path, true);
  const Tokenizer& tok = model->tokenizer();
  const auto ids = tok.encode(text, add_bos, parse_special);
  nlohmann::json out = nlohmann::json::array();
  for (int32_t id : ids) {
    if (pieces) {
      // Pieces may be partial UTF-8; the dump below replaces invalid bytes.
      out.push_back({id, tok.token_to_piece(id)});
    } else {
      out.push_back(id);
    }
  }
  std::string s = out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::printf("%s\n", s.c_str());
  return 0;
}

int cmd_tokenize(const Args& args) { return run_guarded("tokenize", tokenize_main, args); }

}  // namespace step35::cli
