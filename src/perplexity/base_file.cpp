#include "perplexity/base_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "perplexity/token_scores.h"

namespace step35::perplexity {

namespace {

constexpr char kMagic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};
constexpr uint64_t kHeaderBytes = 8 + 3 * sizeof(int32_t);

std::string at(const std::string& path, uint64_t offset) {
  return path + " (offset " + std::to_string(offset) + ")";
}

// Bytes of the token table and of one chunk's rows; false on overflow.
bool body_sizes(const BaseHeader& h, uint64_t* token_bytes, uint64_t* chunk_bytes, uint64_t* total) {
  uint64_t n_tokens, row_bytes, rows;
  if (__builtin_mul_overflow(uint64_t(h.n_ctx), uint64_t(h.n_chunk), &n_tokens)) return false;
  if (__builtin_mul_overflow(n_tokens, uint64_t(sizeof(int32_t)), token_bytes)) return false;
  if (__builtin_mul_overflow(uint64_t(base_row_words(h.n_vocab)), uint64_t(sizeof(uint16_t)), &row_bytes)) return false;
  rows = uint64_t(h.rows_per_chunk());
  if (__builtin_mul_overflow(row_bytes, rows, chunk_bytes)) return false;
  uint64_t all_rows;
  if (__builtin_mul_overflow(*chunk_bytes, uint64_t(h.n_chunk), &all_rows)) return false;
  if (__builtin_add_overflow(kHeaderBytes, *token_bytes, total)) return false;
  if (__builtin_add_overflow(*total, all_rows, total)) return false;
  return true;
}

}  // namespace

BaseFileWriter::BaseFileWriter(const std::string& path, int32_t n_ctx, int32_t n_vocab, int32_t n_chunk,
                               const int32_t* tokens)
    : path_(path) {
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) throw BaseFileError("cannot create " + path + ": " + std::strerror(errno));
  const size_t n_tokens = size_t(n_ctx) * size_t(n_chunk);
  bool ok = std::fwrite(kMagic, 1, sizeof kMagic, f_) == sizeof kMagic;
  ok = ok && std::fwrite(&n_ctx, sizeof n_ctx, 1, f_) == 1;
  ok = ok && std::fwrite(&n_vocab, sizeof n_vocab, 1, f_) == 1;
  ok = ok && std::fwrite(&n_chunk, sizeof n_chunk, 1, f_) == 1;
  ok = ok && std::fwrite(tokens, sizeof(int32_t), n_tokens, f_) == n_tokens;
  if (!ok) {
    std::fclose(f_);
    f_ = nullptr;
    throw BaseFileError("cannot write " + path + ": " + std::strerror(errno));
  }
}

BaseFileWriter::~BaseFileWriter() {
  if (f_) std::fclose(f_);
}

void BaseFileWriter::write_chunk(const std::vector<uint16_t>& rows) {
  if (std::fwrite(rows.data(), sizeof(uint16_t), rows.size(), f_) != rows.size())
    throw BaseFileError("cannot write " + path_ + ": " + std::strerror(errno));
}

void BaseFileWriter::close() {
  std::FILE* f = f_;
  f_ = nullptr;
  const bool flushed = std::fflush(f) == 0;
  const int err = errno;
  if (std::fclose(f) != 0 || !flushed) throw BaseFileError("cannot write " + path_ + ": " + std::strerror(err));
}

BaseFileReader::BaseFileReader(const std::string& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "rb");
  if (!f_) throw BaseFileError("cannot open base file " + path + ": " + std::strerror(errno));
  struct stat st;
  if (::fstat(fileno(f_), &st) != 0 || !S_ISREG(st.st_mode)) {
    std::fclose(f_);
    f_ = nullptr;
    throw BaseFileError("base file " + path + " is not a regular file");
  }
  const uint64_t file_bytes = uint64_t(st.st_size);
  auto fail = [&](const std::string& msg) {
    std::fclose(f_);
    f_ = nullptr;
    throw BaseFileError(msg);
  };
  char magic[8];
  if (file_bytes < kHeaderBytes || std::fread(magic, 1, 8, f_) != 8)
    fail("base file " + path + " is truncated: " + std::to_string(file_bytes) + " bytes, less than the " +
         std::to_string(kHeaderBytes) + "-byte header");
  if (std::memcmp(magic, kMagic, 8) != 0)
    fail("base file " + at(path, 0) + ": does not start with \"_logits_\" (not a llama-perplexity / step35 "
         "--kl-divergence-base file)");
  int32_t fields[3];
  if (std::fread(fields, sizeof(int32_t), 3, f_) != 3) fail("cannot read " + path + ": " + std::strerror(errno));
  BaseHeader& h = header_;
  h.n_ctx = fields[0];
  h.n_vocab = fields[1];
  h.n_chunk = fields[2];
  if (h.n_ctx < 3) fail("base file " + at(path, 8) + ": n_ctx " + std::to_string(h.n_ctx) + " (needs >= 3)");
  if (h.n_vocab < 1) fail("base file " + at(path, 12) + ": n_vocab " + std::to_string(h.n_vocab) + " (needs >= 1)");
  if (h.n_chunk < 1) fail("base file " + at(path, 16) + ": n_chunk " + std::to_string(h.n_chunk) + " (needs >= 1)");
  uint64_t token_bytes = 0, chunk_bytes = 0, total = 0;
  if (!body_sizes(h, &token_bytes, &chunk_bytes, &total))
    fail("base file " + path + ": header sizes overflow (n_ctx " + std::to_string(h.n_ctx) + ", n_vocab " +
         std::to_string(h.n_vocab) + ", n_chunk " + std::to_string(h.n_chunk) + ")");
  const std::string shape = std::to_string(h.n_chunk) + " chunks of " + std::to_string(h.n_ctx) +
                            " tokens, vocab " + std::to_string(h.n_vocab);
  if (file_bytes < total)
    fail("base file " + path + " is truncated: the header announces " + shape + " (" + std::to_string(total) +
         " bytes), the file has " + std::to_string(file_bytes) + " bytes");
  if (file_bytes > total)
    fail("base file " + path + " has " + std::to_string(file_bytes - total) + " bytes after the " + shape +
         " its header announces");
  h.tokens.resize(size_t(token_bytes / sizeof(int32_t)));
  if (std::fread(h.tokens.data(), sizeof(int32_t), h.tokens.size(), f_) != h.tokens.size())
    fail("cannot read " + path + ": " + std::strerror(errno));
  for (size_t i = 0; i < h.tokens.size(); ++i)
    if (h.tokens[i] < 0 || h.tokens[i] >= h.n_vocab)
      fail("base file " + at(path, kHeaderBytes + i * sizeof(int32_t)) + ": token " + std::to_string(i) + " is " +
           std::to_string(h.tokens[i]) + ", outside the vocabulary of " + std::to_string(h.n_vocab));
  offset_ = kHeaderBytes + token_bytes;
}

BaseFileReader::~BaseFileReader() {
  if (f_) std::fclose(f_);
}

void BaseFileReader::read_chunk(std::vector<uint16_t>& rows) {
  const BaseHeader& h = header_;
  if (chunks_read_ >= h.n_chunk)
    throw BaseFileError("base file " + path_ + ": all " + std::to_string(h.n_chunk) + " chunks already read");
  const size_t words = base_row_words(h.n_vocab);
  rows.resize(size_t(h.rows_per_chunk()) * words);
  if (std::fread(rows.data(), sizeof(uint16_t), rows.size(), f_) != rows.size())
    throw BaseFileError("cannot read " + at(path_, offset_) + ": " +
                        (std::feof(f_) ? std::string("unexpected end of file") : std::strerror(errno)));
  // A row's log-probabilities are scale · q + min with scale >= 0 and min <= 0 (finite):
  // anything else is a damaged file, which would otherwise turn every statistic into NaN.
  for (int32_t r = 0; r < h.rows_per_chunk(); ++r) {
    const uint16_t* row = rows.data() + size_t(r) * words;
    float scale, min_log_prob;
    std::memcpy(&scale, row, sizeof scale);
    std::memcpy(&min_log_prob, row + 2, sizeof min_log_prob);
    if (!(std::isfinite(scale) && scale >= 0 && std::isfinite(min_log_prob) && min_log_prob <= 0))
      throw BaseFileError("base file " + at(path_, offset_ + uint64_t(r) * words * sizeof(uint16_t)) + ": chunk " +
                          std::to_string(chunks_read_ + 1) + " row " + std::to_string(r) +
                          " has scale " + std::to_string(scale) + " and minimum log-probability " +
                          std::to_string(min_log_prob) + " (need a finite scale >= 0 and minimum <= 0)");
  }
  offset_ += uint64_t(rows.size()) * sizeof(uint16_t);
  ++chunks_read_;
}

}  // namespace step35::perplexity
