// The "base" file of a KL-divergence comparison: llama-perplexity's own format (what its
// --kl-divergence-base writes without --kl-divergence), so a base made by either engine
// is read by the other. All little-endian:
//
//   char[8]  "_logits_"
//   int32    n_ctx                 tokens per chunk
//   int32    n_vocab
//   int32    n_chunk
//   int32    tokens[n_chunk·n_ctx]  the text's tokens (the first of each chunk as in the text,
//                                   not the BOS the model saw there)
//   then per chunk, per scored position j = n_ctx/2 .. n_ctx-2 (n_ctx - 1 - n_ctx/2 rows):
//   uint16   row[base_row_words(n_vocab)]  (token_scores.h: scale and min log-prob as two
//                                   floats, then the quantised log-probabilities, padding)
#pragma once

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace step35::perplexity {

// A malformed, truncated or unreadable base file; the message names the file and the
// byte offset or field.
class BaseFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct BaseHeader {
  int32_t n_ctx = 0, n_vocab = 0, n_chunk = 0;
  std::vector<int32_t> tokens;  // n_chunk · n_ctx
  int32_t first_scored() const { return n_ctx / 2; }
  int32_t rows_per_chunk() const { return n_ctx - 1 - n_ctx / 2; }
};

class BaseFileWriter {
 public:
  // Creates `path` and writes the header (tokens: the first n_chunk · n_ctx of the text).
  BaseFileWriter(const std::string& path, int32_t n_ctx, int32_t n_vocab, int32_t n_chunk, const int32_t* tokens);
  ~BaseFileWriter();
  BaseFileWriter(const BaseFileWriter&) = delete;
  BaseFileWriter& operator=(const BaseFileWriter&) = delete;
  // Appends one chunk's rows (rows_per_chunk · base_row_words words).
  void write_chunk(const std::vector<uint16_t>& rows);
  // Flushes and closes; throws if anything failed to reach the file.
  void close();

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

class BaseFileReader {
 public:
  // Opens and validates `path`: magic, positive sizes, every token id < n_vocab, and a file
  // size equal to what the header announces (a shorter file is reported as truncated).
  explicit BaseFileReader(const std::string& path);
  ~BaseFileReader();
  BaseFileReader(const BaseFileReader&) = delete;
  BaseFileReader& operator=(const BaseFileReader&) = delete;
  const BaseHeader& header() const { return header_; }
  // Reads the next chunk's rows into `rows` and checks each row's scale and minimum.
  void read_chunk(std::vector<uint16_t>& rows);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  BaseHeader header_;
  uint64_t offset_ = 0;
  int32_t chunks_read_ = 0;
};

}  // namespace step35::perplexity
