// libFuzzer target: arbitrary bytes through the tokenizer of a fixture model (tiny-a, the
// step35 vocabulary shape). Built by CMake with -DSTEP35_FUZZ=ON (see fuzz/run.sh).
//
// Input layout: byte 0 selects the mode, the rest is the text (or, in mode 3, token ids).
// Checked besides "no crash, no UB, no hang":
//  - encode accepts any bytes (invalid UTF-8 included) and every id is in the vocabulary;
//  - decode(encode(text)) == text (after the BOS text when BOS was added): the tokenizer's
//    documented round trip;
//  - decode of arbitrary ids answers, or throws std::out_of_range for ids outside the vocab;
//  - Utf8Stream passes every byte through exactly once (whatever the chunking).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#ifndef STEP35_FIXTURES_DIR
#define STEP35_FIXTURES_DIR "../shared/fixtures"
#endif

using namespace step35;

namespace {

std::unique_ptr<gguf::File> g_file;
std::unique_ptr<Tokenizer> g_tok;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_tokenizer: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("STEP35_FUZZ_MODEL");
  const std::string path = env ? env : STEP35_FIXTURES_DIR "/models/tiny-a-q4_k_m.gguf";
  try {
    g_file = gguf::File::open(path);
    g_tok = Tokenizer::from_gguf(*g_file);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_tokenizer: cannot load the tokenizer (set STEP35_FUZZ_MODEL): %s\n", e.what());
    std::exit(1);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] & 3;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const Tokenizer& tok = *g_tok;

  if (mode == 3) {  // arbitrary ids (little-endian int32s, out-of-range ones included)
    std::vector<TokenId> ids(text.size() / 4);
    if (!ids.empty()) std::memcpy(ids.data(), text.data(), ids.size() * 4);
    try {
      (void)tok.decode(ids, true);
      (void)tok.decode(ids, false);
      for (TokenId id : ids)
        if (id < 0 || size_t(id) >= tok.n_vocab()) fail("decode accepted an id outside the vocab", std::to_string(id));
    } catch (const std::out_of_range&) {
    }
    return 0;
  }

  const bool add_special = mode & 1, parse_special = mode & 2;
  std::vector<TokenId> ids = tok.encode(text, add_special, parse_special);
  for (TokenId id : ids)
    if (id < 0 || size_t(id) >= tok.n_vocab()) fail("encode produced an id outside the vocab", std::to_string(id));
  std::string expect;
  if (add_special && tok.add_bos()) expect = tok.token_to_piece(tok.bos(), true);
  expect += text;
  const std::string back = tok.decode(ids, true);
  if (back != expect) fail("round trip differs", "input of " + std::to_string(text.size()) + " bytes");

  // Streaming decode: chunked by the first byte, every byte comes out once.
  Utf8Stream stream;
  std::string streamed;
  const size_t step = size_t(data[0] >> 2) + 1;
  for (size_t p = 0; p < back.size(); p += step) streamed += stream.push(std::string_view(back).substr(p, step));
  streamed += stream.flush();
  if (streamed != back) fail("Utf8Stream changed the bytes", std::to_string(back.size()) + " bytes in");
  return 0;
}
