// libFuzzer entry point: arbitrary bytes as a JSON Schema for make_json_constraint and the
// validator (tests/json_schema_check.h). Built by CMake with -DSTEP35_FUZZ=ON (see fuzz/run.sh):
//   fuzz/run.sh 60            # every target, 60 s each
//   build-fuzz/bin/fuzz_json_schema -max_len=4096 fuzz/corpus/json_schema
//
// Besides "no crash, no hang, no exception other than std::invalid_argument", it checks
// the constraint's promise: a generation driven by the input (random choices, then the
// shortest way to finish) must end, parse as JSON and validate against the schema.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "structured/grammar_constraint.h"
#include "structured/json_constraint.h"
#include "tokenizer/tokenizer.h"
#include "../tests/json_schema_check.h"

using nlohmann::json;

namespace {

// GPT-2 byte-level mapping: the vocabulary spelling of one byte.
// A small byte-level vocabulary: every byte, some JSON-ish multi-byte pieces, an EOG
// control token and a user-defined one.
const step35::Tokenizer& vocab() {
  static std::unique_ptr<step35::Tokenizer> tok = [] {
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(step35::byte_level_text(uint8_t(b)));
      types.push_back(1);
    }
    for (const char* piece : {"{\"", "\":", "\", \"", "\"}", "true", "false", "null", "  ", "\n  ", "12", "ab", ", "}) {
      std::string m;
      for (const char* c = piece; *c; ++c) m += step35::byte_level_text(uint8_t(*c));
      tokens.push_back(m);
      types.push_back(1);
    }
    tokens.push_back("<|im_end|>");
    types.push_back(3);
    tokens.push_back("<think>");
    types.push_back(4);
    step35::gguf::Writer w;
    w.set_str("tokenizer.ggml.model", "gpt2");
    w.set_str("tokenizer.ggml.pre", "deepseek-v3");
    w.set_arr_str("tokenizer.ggml.tokens", tokens);
    w.set_arr_i32("tokenizer.ggml.token_type", types);
    w.set_arr_str("tokenizer.ggml.merges", {});
    w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(tokens.size() - 2));
    w.set_bool("tokenizer.ggml.add_bos_token", false);
    const std::vector<uint8_t> bytes = w.to_bytes();
    auto f = step35::gguf::File::parse_buffer(bytes.data(), bytes.size(), "fuzz-vocab.gguf");
    return step35::Tokenizer::from_gguf(*f);
  }();
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const json schema = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return 0;
  for (const char* v : {"null", "true", "0", "-1.5", "\"\"", "\"2024-01-31\"", "[]", "[1,\"a\",null]", "{}",
                        "{\"a\":1,\"b\":[true]}"})
    (void)step35::testing::schema_violation(schema, json::parse(v));
  (void)step35::testing::schema_violation(schema, schema);

  const step35::Tokenizer& tok = vocab();
  std::unique_ptr<step35::TokenConstraint> c;
  try {
    c = step35::make_json_constraint(schema, tok);
  } catch (const std::invalid_argument&) {
    return 0;  // a clear error is the expected outcome for most inputs
  }
  auto& g = dynamic_cast<step35::grammar::GrammarConstraint&>(*c);
  const size_t V = tok.n_vocab();
  std::vector<float> logits(V);
  std::string text;
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ULL;
  bool ended = false;
  uint64_t limit = 41;  // 40 random steps; then (set at step 40) enough closing steps to finish
  for (uint64_t step = 0; step < limit && !ended; ++step) {
    if (step == 40) {
      const uint64_t rest = g.min_remaining_bytes();
      if (rest > 20000) return 0;  // e.g. a huge minLength: too long to drive here
      limit = 40 + rest + 2;  // each closing step takes one byte off the shortest ending
    }
    std::fill(logits.begin(), logits.end(), 0.0f);
    c->mask(logits.data(), V);
    std::vector<int32_t> allowed;
    for (size_t t = 0; t < V; ++t)
      if (logits[t] == 0.0f) allowed.push_back(int32_t(t));
    if (allowed.empty()) std::abort();  // mask() must always leave a token
    int32_t next = allowed[0];
    if (step < 40) {  // input-driven choices, then the shortest way to finish
      h = h * 6364136223846793005ULL + 1442695040888963407ULL;
      next = allowed[(h >> 33) % allowed.size()];
    } else if (c->complete()) {
      next = tok.eog_ids()[0];  // (trailing whitespace would also keep it complete)
    } else {
      uint64_t best = UINT64_MAX;
      for (int32_t t : allowed) {
        const uint64_t d = g.min_remaining_after(t);
        if (d < best) best = d, next = t;
      }
    }
    if (tok.is_eog(next)) {
      ended = true;
      break;
    }
    c->accept(next);
    text += tok.token_to_piece(next);
  }
  if (!ended || g.failed()) std::abort();
  const json out = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded()) std::abort();  // constrained output must parse
  // oneOf is compiled as anyOf (overlapping branches may both match): skip that case.
  if (std::string(reinterpret_cast<const char*>(data), size).find("oneOf") == std::string::npos) {
    const std::string why = step35::testing::schema_violation(schema, out);
    if (!why.empty()) {
      std::fprintf(stderr, "output %s does not validate: %s\n", text.c_str(), why.c_str());
      std::abort();
    }
  }
  return 0;
}
