// Byte-level BPE tokenizer read from GGUF metadata (tokenizer.ggml.*), with the
// pre-tokenizer selected by tokenizer.ggml.pre and special-token carving.
// Algorithm: docs/architecture.md, "Tokenizer".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace step35::gguf { class File; }

namespace step35 {

using TokenId = int32_t;

enum class TokenType : int32_t {
  UNDEFINED = 0, NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6,
};

// GPT-2's bytes_to_unicode (architecture.md "Tokenizer", step 3): the text that stands for byte b
// in a byte-level BPE vocabulary (UTF-8). Bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF stand for
// themselves, the other 68 for U+0100, U+0101, ... in increasing byte order.
const std::string& byte_level_text(uint8_t b);

class Tokenizer {
 public:
  // Reads tokens, token types, merges, special ids and the pre-tokenizer name.
  // Throws gguf::Error on missing/malformed keys or an unsupported tokenizer model.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& file);

  // add_special: prepend BOS when the vocab says add_bos (llama_tokenize add_special).
  // parse_special: carve CONTROL tokens out of the text (USER_DEFINED always are).
  // Arbitrary bytes are accepted (invalid UTF-8 included); the result always decodes
  // back to exactly the input bytes (plus the BOS text if added).
  // Text longer than kMaxEncodeBytes is refused with std::length_error before it is read:
  // every byte can become one token, and token counts and positions are int32.
  static constexpr size_t kMaxEncodeBytes = size_t(1) << 30;
  std::vector<TokenId> encode(std::string_view text, bool add_special, bool parse_special) const;

  // Text of one token as raw bytes (byte-level mapping inverted). Control tokens give
  // their literal text when `special` is true, nothing otherwise.
  std::string token_to_piece(TokenId id, bool special = true) const;
  std::string decode(const std::vector<TokenId>& ids, bool special = true) const;

  size_t n_vocab() const { return tokens_.size(); }
  const std::string& token_text(TokenId id) const { return tokens_.at(size_t(id)); }  // vocab form
  TokenType token_type(TokenId id) const { return types_.at(size_t(id)); }
  TokenId find_token(std::string_view text) const;  // by vocab string; -1 if absent
  TokenId bos() const { return bos_; }
  TokenId eos() const { return eos_; }
  TokenId eot() const { return eot_; }  // -1 when the file names none
  TokenId pad() const { return pad_; }  // -1 when the file names none
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool is_eog(TokenId id) const;  // end of generation: eos, eot, <|im_end|>, ...
  const std::vector<TokenId>& eog_ids() const { return eog_; }
  const std::string& pre_type() const { return pre_; }  // the split rule in use
  size_t n_merges() const { return n_merges_; }

  // Pre-tokenizer split of plain text (no special tokens), exposed for tests.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

 private:
  Tokenizer() = default;
  // The steps of from_gguf; `where` names the file in messages.
  void read_vocabulary(const gguf::File& f, const std::string& where);
  void read_merges(const gguf::File& f, const std::string& where);
  void choose_pre_tokenizer(const gguf::File& f, const std::string& where);
  void collect_eog(TokenId eom, const std::string& where);
  void read_add_special(const gguf::File& f, const std::string& where);
  void sort_special_tokens();
  void decode_pieces();
  // Appends the ids of one pre-tokenized piece (raw bytes) to `out`.
  void bpe(std::string_view piece, std::vector<TokenId>& out) const;

  enum class PreKind : uint8_t { DEEPSEEK_V3 = 0, GPT2 = 1, LLAMA3 = 2 };  // split rules
  // A merge of two adjacent symbols. Symbols are token ids, or ids >= n_vocab for strings
  // that occur in merges but are not tokens themselves.
  struct MergeTarget {
    int32_t rank;
    int32_t result;
  };

  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string, TokenId> token_to_id_;
  std::unordered_map<uint64_t, MergeTarget> merges_;     // (left << 32 | right) -> merge
  int32_t byte_symbol_[256] = {};   // symbol of each byte's mapped char (-1: none)
  TokenId byte_token_[256] = {};    // token of each byte's mapped char (-1: none)
  std::vector<std::string> pieces_; // token_to_piece(id, true) of every token
  std::vector<TokenId> special_sorted_;                  // carve-out order (longest first)
  std::vector<TokenId> eog_;
  std::string pre_;
  PreKind pre_kind_ = PreKind::DEEPSEEK_V3;
  size_t n_merges_ = 0;
  TokenId bos_ = -1, eos_ = -1, eot_ = -1, pad_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
};

// Incremental UTF-8 assembly for streaming: feed token pieces, get back only complete
// UTF-8 sequences; invalid bytes are passed through once they can no longer complete.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);
  std::string flush();

 private:
  std::string pending_;
};

}  // namespace step35
