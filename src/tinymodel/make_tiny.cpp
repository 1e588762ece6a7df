// Random-weight step35 models (see make_tiny.h). The layout follows docs/architecture.md:
// the keys of "Hyperparameters", the tensors and tokenizer keys of "GGUF: keys and tensors",
// and the schedule of "Per-layer schedule" scaled down (full attention every 4th layer, more
// query heads on SWA layers, leading dense layers, MoE with a sigmoid router + selection bias
// and a shared expert, SwiGLU clamps on the last layers, llama3 rope_freqs, MTP).
//
// Weights: every tensor draws from its own PRNG stream seeded from (seed, tensor name),
// so tensors do not depend on each other's order or size, and an F32 / F16 / BF16 / Q8_0
// file of one preset and seed hold the same underlying values (rounded to the storage
// type from the same F32 numbers).
#include "tinymodel/make_tiny.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <exception>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "gguf/gguf_writer.h"
#include "model/step35.h"
#include "tensor/quants.h"
#include "tokenizer/tokenizer.h"

namespace step35 {

namespace {

// ---------------------------------------------------------------------------------------
// Presets
// ---------------------------------------------------------------------------------------

struct Shape {
  int32_t n_layer;         // trunk layers
  int32_t n_mtp;           // MTP blocks appended after the trunk
  int32_t n_embd;
  int32_t head_dim;        // K and V
  int32_t n_head_full;     // query heads on full-attention layers
  int32_t n_head_swa;      // query heads on SWA layers
  int32_t n_head_kv;       // all layers
  int32_t swa_window;
  int32_t swa_period;      // layer il is full attention iff il % swa_period == 0
  int32_t n_dense;         // leading dense-MLP layers
  int32_t n_ff;            // dense MLP size (also the MTP blocks' when dense)
  int32_t n_expert;
  int32_t n_expert_used;
  int32_t n_ff_exp;
  int32_t n_ff_shexp;
  int32_t n_ctx;
  int32_t rope_orig_ctx;   // llama3 "original_max_position_embeddings"
  bool mtp_swa;            // MTP blocks use SWA (the real model) instead of the trunk pattern
  bool mtp_dense;          // MTP blocks use a dense MLP (the real model) instead of MoE
  int32_t n_merges;        // BPE merges to train
  int32_t vocab_pad;       // pad the vocabulary with unused tokens up to this size (0: none)
};

// "tiny": the real model's proportions at 14M parameters. The query width is 1x / 1.5x
// n_embd on full / SWA layers (8 / 12 heads of 32), the dense MLP is 2.75x n_embd (11264 /
// 4096 in the release), the experts 0.25x n_embd, and the llama3 "original" context is a
// quarter of the training context (the release: 131072 of 262144 x 2). The MTP block is an
// SWA block with a dense MLP, as in the release.
constexpr Shape kTiny = {
    /*n_layer*/ 8, /*n_mtp*/ 1, /*n_embd*/ 256, /*head_dim*/ 32, /*n_head_full*/ 8, /*n_head_swa*/ 12,
    /*n_head_kv*/ 2, /*swa_window*/ 32, /*swa_period*/ 4, /*n_dense*/ 2, /*n_ff*/ 704,
    /*n_expert*/ 32, /*n_expert_used*/ 4, /*n_ff_exp*/ 64, /*n_ff_shexp*/ 64, /*n_ctx*/ 4096,
    /*rope_orig_ctx*/ 1024, /*mtp_swa*/ true, /*mtp_dense*/ true, /*n_merges*/ 737, /*vocab_pad*/ 0};

// "bench": the benchmark model of ../shared/docs/peer.md (713 M parameters). Its MTP block
// follows the reference generator's layout (trunk pattern, so layer 12 is full attention,
// and MoE), which is what the 713 M figure and the peer's measurements refer to.
constexpr Shape kBench = {
    /*n_layer*/ 12, /*n_mtp*/ 1, /*n_embd*/ 1024, /*head_dim*/ 128, /*n_head_full*/ 16, /*n_head_swa*/ 24,
    /*n_head_kv*/ 2, /*swa_window*/ 512, /*swa_period*/ 4, /*n_dense*/ 2, /*n_ff*/ 2816,
    /*n_expert*/ 64, /*n_expert_used*/ 8, /*n_ff_exp*/ 256, /*n_ff_shexp*/ 256, /*n_ctx*/ 8192,
    /*rope_orig_ctx*/ 4096, /*mtp_swa*/ false, /*mtp_dense*/ false, /*n_merges*/ 737, /*vocab_pad*/ 16384};

// Values shared by both presets (the release model's, architecture.md "Hyperparameters").
constexpr float kRopeBase = 5e6f;
constexpr float kRopeBaseSwa = 1e4f;
constexpr double kRopeFactor = 2.0;       // llama3 scaling of the full layers
constexpr double kRopeLowFreqFactor = 1.0;
constexpr double kRopeHighFreqFactor = 32.0;
constexpr float kRmsEps = 1e-5f;
constexpr float kExpertWeightsScale = 3.0f;
constexpr float kClampExp = 7.0f;         // routed experts, last two trunk layers
constexpr float kClampShexp = 16.0f;      // shared expert / dense MLP, last trunk layer

// Weight statistics: N(0, gain / sqrt(fan_in)) for matrices; norms 1 + 0.1·N(0,1) (GGUF
// stores 1 + w). Residual writers get gain 0.5 and routed experts share 91% of their
// variance with a common base matrix (diversity 0.3): both keep the random MoE from being
// chaotic, so a routing flip at a near-tie changes the output little and different
// implementations stay comparable.
constexpr double kNormJitter = 0.1;
constexpr double kEmbdStd = 1.0;
constexpr double kOutGain = 2.0;
constexpr double kRouterGain = 1.0;
constexpr double kRouterBiasStd = 0.05;
constexpr double kResidGain = 0.5;
constexpr double kExpertDiversity = 0.3;

// ---------------------------------------------------------------------------------------
// Random numbers: splitmix64 to seed xoshiro256** (fast, good quality, fully specified, so
// a seed gives the same file on every platform).
// ---------------------------------------------------------------------------------------

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& w : s_) w = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Approximately standard normal: the sum of four 16-bit uniforms (one 64-bit draw),
  // centred and scaled to unit variance (Irwin-Hall n = 4; the tails stop at ±3.46σ,
  // which is harmless for random weights and keeps generation at a few ns per value).
  double gauss() {
    const uint64_t x = next();
    const double sum = double((x & 0xFFFF) + ((x >> 16) & 0xFFFF) + ((x >> 32) & 0xFFFF) + (x >> 48));
    // each uniform is (k + 0.5) / 65536 with mean 1/2 and variance ~1/12
    return ((sum + 2.0) / 65536.0 - 2.0) * 1.7320508075688772;
  }

 private:
  uint64_t s_[4];
};

// The stream of one tensor.
Rng tensor_rng(uint64_t seed, const std::string& name) {
  return Rng(seed * 0x9E3779B97F4A7C15ull + fnv1a64(name));
}

// ---------------------------------------------------------------------------------------
// Tokenizer: byte-level BPE trained on a built-in text (architecture.md "Tokenizer")
// ---------------------------------------------------------------------------------------

// Original text written for this generator: plain English with some numbers, code and
// punctuation, so the merges cover common words, spaces-before-words and digit groups.
const char* const kTrainText =
    "The old lighthouse stood at the end of a narrow stone pier, and every evening the keeper\n"
    "climbed the one hundred and twelve steps to light the lamp. She kept a small notebook\n"
    "in her coat pocket and wrote down the weather, the ships she saw, and the time the light\n"
    "came on. Most nights were quiet. Sometimes a storm came in from the west, the rain\n"
    "turned sideways, and the waves threw white foam over the railing. On those nights she\n"
    "stayed in the lamp room until morning, drinking tea and listening to the wind.\n"
    "\n"
    "In the village below, the baker opened his shop before sunrise. He made bread, rolls\n"
    "and a sweet cake with apples and cinnamon that people came from the next town to buy.\n"
    "The children who walked past on their way to school would stop at the window and\n"
    "count the loaves on the shelves. The teacher, a patient man with a grey beard, taught\n"
    "them reading, writing, numbers and the names of the stars. When the weather was good\n"
    "he took the class down to the harbour to watch the fishing boats come back with their\n"
    "nets full of silver fish.\n"
    "\n"
    "A computer is a machine that follows instructions. It reads a number from memory,\n"
    "changes it, and writes it back, millions of times every second. A program is a list\n"
    "of such instructions written by a person who wants the machine to do something useful:\n"
    "add up a column of prices, draw a picture on the screen, or answer a question. A good\n"
    "program is clear and simple, so that other people can read it, understand it, and\n"
    "change it later without breaking anything. Tests help with that: a test runs a small\n"
    "part of the program and checks that the answer is the one we expected.\n"
    "\n"
    "Language models predict the next word. They turn each word into a list of numbers,\n"
    "mix those numbers together in many layers, and produce a score for every word they\n"
    "know. The word with the highest score is often a good guess, but picking a word at\n"
    "random, weighted by the scores, makes the text more varied and more interesting. A\n"
    "small model trained on very little text knows almost nothing, yet it is still useful\n"
    "for checking that the machinery works from the first layer to the last.\n"
    "\n"
    "Questions and answers: What time is it? It is half past seven. Where are you going?\n"
    "I am going to the market to buy eggs, milk, butter, flour and three green peppers.\n"
    "How much does it cost? About 12 dollars, or 9.50 if you bring your own bag. Why is the\n"
    "sky blue? Because the air scatters blue light more than red light. Who wrote this\n"
    "story? Nobody important; it was written to give a tokenizer something to learn from.\n"
    "\n"
    "Numbers and dates appear everywhere: 0 1 2 3 4 5 6 7 8 9 10 16 25 32 64 100 128 256\n"
    "512 1000 1024 2048 4096 8192 65536, the year 2025, the date 2025-03-14, the time\n"
    "08:45:30, a temperature of -3 degrees, a score of 98%, and a price of $4.99.\n"
    "Code looks different from prose: int main() { return 0; } and for (i = 0; i < n; i++)\n"
    "{ total += values[i]; } and if x == 1: print(\"one\") else: print(\"other\").\n"
    "Brackets (round), [square] and {curly}; quotes \"double\" and 'single'; a path like\n"
    "/usr/local/bin and a web address like https://example.com/index.html.\n"
    "\n"
    "The river ran through the middle of the town, under three bridges and past the mill.\n"
    "In spring the water was high and brown; in summer it was low and clear, and you could\n"
    "see the stones on the bottom and small fish moving between them. Farmers brought\n"
    "their sheep and cows to the meadow by the river, and in the autumn the whole town\n"
    "gathered there for the harvest festival, with music, dancing, long tables of food and\n"
    "a bonfire that burned until after midnight. Winter was long and dark, but the people\n"
    "were used to it. They mended their nets, told old stories by the fire, and waited for\n"
    "the first warm day, when the ice on the river cracked and the birds came back.\n";

bool is_letter(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_newline(char c) { return c == '\n' || c == '\r'; }
bool is_punct(char c) { return !is_letter(c) && !is_digit(c) && !is_space(c); }

// Splits ASCII training text into pre-tokens roughly the way the deepseek-v3 pre-tokenizer
// does (architecture.md "Tokenizer"): digit groups of at most 3, [punct] or [one non-letter] +
// letters, [space] + punctuation + newlines, whitespace runs that leave their last space to the
// next word. Only the training needs this; any merge list is a valid BPE, so approximations just
// make some merges less useful.
std::vector<std::string> pre_split(const std::string& text) {
  std::vector<std::string> pieces;
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    const char c = text[i];
    const bool next_letter = i + 1 < n && is_letter(text[i + 1]);
    if (is_digit(c)) {
      while (j < n && j - i < 3 && is_digit(text[j])) ++j;
    } else if (is_letter(c) || (next_letter && !is_newline(c) && !is_digit(c))) {
      // letters, or one leading space / punctuation char + letters
      j = is_letter(c) ? i : i + 1;
      while (j < n && is_letter(text[j])) ++j;
    } else if (is_punct(c) || (c == ' ' && i + 1 < n && is_punct(text[i + 1]))) {
      j = c == ' ' ? i + 1 : i;
      while (j < n && is_punct(text[j])) ++j;
      while (j < n && is_newline(text[j])) ++j;
    } else {  // whitespace
      while (j < n && is_space(text[j])) ++j;
      size_t last_nl = std::string::npos;
      for (size_t k = i; k < j; ++k)
        if (is_newline(text[k])) last_nl = k;
      if (last_nl != std::string::npos) {
        j = last_nl + 1;  // \s*[\r\n]+
      } else if (j < n && j - i > 1) {
        --j;  // \s+(?!\S): the last space goes with the next piece
      }
    }
    pieces.push_back(text.substr(i, j - i));
    i = j;
  }
  return pieces;
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;  // "left right", index = rank
  int32_t bos = -1, eos = -1, pad = -1, im_start = -1, im_end = -1;
};

// Token types (architecture.md "GGUF: keys and tensors").
constexpr int32_t kTokNormal = 1, kTokControl = 3, kTokUserDefined = 4, kTokUnused = 5;

// Byte-level BPE trained on kTrainText. Symbols are small ints naming strings; the same
// string is always the same symbol (two merge paths can produce one string, and later
// merges must see it as one).
class BpeTrainer {
 public:
  BpeTrainer() {
    // Distinct pre-tokens as symbol sequences, with their counts (std::map: deterministic).
    std::map<std::vector<int32_t>, int64_t> word_counts;
    for (const std::string& piece : pre_split(kTrainText)) {
      std::vector<int32_t> syms;
      for (unsigned char b : piece) syms.push_back(symbol(byte_level_text(b)));
      word_counts[syms]++;
    }
    words_.assign(word_counts.begin(), word_counts.end());
    for (const auto& [syms, count] : words_) count_pairs(syms, count);
  }

  // Up to n_merges merges, in rank order, as (left, right) strings.
  std::vector<std::pair<std::string, std::string>> train(int32_t n_merges) {
    std::vector<std::pair<std::string, std::string>> merges;
    for (int32_t m = 0; m < n_merges; ++m) {
      const auto best = most_frequent_pair();
      if (best == pair_counts_.end()) break;  // every word is one symbol
      const int32_t left = best->first.first, right = best->first.second;
      merges.push_back({sym_str_[size_t(left)], sym_str_[size_t(right)]});
      merge(left, right);
    }
    return merges;
  }

 private:
  using PairCounts = std::map<std::pair<int32_t, int32_t>, int64_t>;

  int32_t symbol(const std::string& s) {
    auto it = sym_id_.find(s);
    if (it != sym_id_.end()) return it->second;
    sym_str_.push_back(s);
    return sym_id_[s] = int32_t(sym_str_.size() - 1);
  }

  // Pair counts are kept up to date incrementally: a merge only revisits the words that
  // contain the merged pair.
  void count_pairs(const std::vector<int32_t>& syms, int64_t count) {
    for (size_t k = 0; k + 1 < syms.size(); ++k) pair_counts_[{syms[k], syms[k + 1]}] += count;
  }

  // The most frequent pair; ties go to the smallest (left, right) string pair. Drops the
  // pairs no word holds any more on the way.
  PairCounts::iterator most_frequent_pair() {
    auto best = pair_counts_.end();
    for (auto it = pair_counts_.begin(); it != pair_counts_.end();) {
      if (it->second <= 0) {
        it = pair_counts_.erase(it);
        continue;
      }
      if (best == pair_counts_.end() || it->second > best->second ||
          (it->second == best->second &&
           std::tie(sym_str_[size_t(it->first.first)], sym_str_[size_t(it->first.second)]) <
               std::tie(sym_str_[size_t(best->first.first)], sym_str_[size_t(best->first.second)])))
        best = it;
      ++it;
    }
    return best;
  }

  // Replaces every (left, right) in the words by the symbol of their concatenation.
  void merge(int32_t left, int32_t right) {
    const int32_t joined = symbol(sym_str_[size_t(left)] + sym_str_[size_t(right)]);
    for (auto& [syms, count] : words_) {
      bool has = false;
      for (size_t k = 0; k + 1 < syms.size() && !has; ++k) has = syms[k] == left && syms[k + 1] == right;
      if (!has) continue;
      count_pairs(syms, -count);
      std::vector<int32_t> merged;
      for (size_t k = 0; k < syms.size(); ++k) {
        if (k + 1 < syms.size() && syms[k] == left && syms[k + 1] == right) {
          merged.push_back(joined);
          ++k;
        } else {
          merged.push_back(syms[k]);
        }
      }
      syms = std::move(merged);
      count_pairs(syms, count);
    }
  }

  std::vector<std::string> sym_str_;
  std::map<std::string, int32_t> sym_id_;
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words_;
  PairCounts pair_counts_;
};

// The vocabulary around the trained merges.
Vocab assemble_vocab(const std::vector<std::pair<std::string, std::string>>& merges, int32_t vocab_pad) {
  Vocab v;
  auto add = [&](const std::string& tok, int32_t type) {
    v.tokens.push_back(tok);
    v.types.push_back(type);
    return int32_t(v.tokens.size() - 1);
  };
  // DeepSeek-style control tokens first (BOS 0, as in the release), then the 256 byte
  // tokens (id = 3 + byte), then one token per new merge result, then the chat tokens.
  v.bos = add("<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", kTokControl);
  v.eos = add("<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", kTokControl);
  v.pad = add("<\xEF\xBD\x9C\xE2\x96\x81pad\xE2\x96\x81\xEF\xBD\x9C>", kTokControl);
  std::map<std::string, int32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const std::string& s = byte_level_text(uint8_t(b));
    seen[s] = add(s, kTokNormal);
  }
  for (const auto& [left, right] : merges) {
    v.merges.push_back(left + " " + right);
    const std::string tok = left + right;
    if (!seen.count(tok)) seen[tok] = add(tok, kTokNormal);
  }
  v.im_start = add("<|im_start|>", kTokControl);
  v.im_end = add("<|im_end|>", kTokControl);
  add("<think>", kTokUserDefined);
  add("</think>", kTokUserDefined);
  // Padding as the converter writes ids without a token (architecture.md "GGUF: keys and tensors").
  while (int32_t(v.tokens.size()) < vocab_pad) add("[PAD" + std::to_string(v.tokens.size()) + "]", kTokUnused);
  return v;
}

Vocab build_vocab(int32_t n_merges, int32_t vocab_pad) {
  return assemble_vocab(BpeTrainer().train(n_merges), vocab_pad);
}

// ChatML, so the chat renderer uses plain ChatML (the same text as the reference
// generator's fixtures).
const char* const kChatTemplate =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// ---------------------------------------------------------------------------------------
// RoPE factors (architecture.md "Attention", step 3): llama3-style per-frequency divisors for the
// full layers, which rotate R = head_dim / 2 dims. The tensor has head_dim / 2 entries like the
// release's {64}; the first R / 2 are used, the rest are 1.0 padding.
// ---------------------------------------------------------------------------------------

std::vector<float> llama3_rope_factors(int32_t head_dim, double base, int32_t orig_ctx) {
  const int32_t n_rot = head_dim / 2;
  std::vector<float> out(size_t(head_dim / 2), 1.0f);
  const double low_wavelen = double(orig_ctx) / kRopeLowFreqFactor;
  const double high_wavelen = double(orig_ctx) / kRopeHighFreqFactor;
  const double pi = 3.14159265358979323846;
  for (int32_t i = 0; i < n_rot / 2; ++i) {
    const double freq = std::pow(base, -2.0 * double(i) / double(n_rot));
    const double wavelen = 2.0 * pi / freq;
    double f;
    if (wavelen < high_wavelen) {
      f = 1.0;
    } else if (wavelen > low_wavelen) {
      f = kRopeFactor;
    } else {
      const double s = (double(orig_ctx) / wavelen - kRopeLowFreqFactor) / (kRopeHighFreqFactor - kRopeLowFreqFactor);
      f = 1.0 / ((1.0 - s) / kRopeFactor + s);
    }
    out[size_t(i)] = float(f);
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Tensor emission
// ---------------------------------------------------------------------------------------

// Collects the tensor list, then fills all tensors in parallel (each from its own stream,
// so the bytes do not depend on the thread count or schedule) and hands them to the
// writer in declaration order.
class TensorEmitter {
 public:
  TensorEmitter(uint64_t seed, DType matrix_type) : seed_(seed), matrix_type_(matrix_type) {}

  // A weight matrix (2-D {in, out} or 3-D {in, out, n_expert}) of the requested type,
  // N(0, std_dev). Expert tensors share a base matrix.
  void matrix(const std::string& name, std::vector<int64_t> ne, double std_dev, bool experts = false) {
    DType t = matrix_type_;
    if (!row_bytes(t, ne[0])) t = DType::F16;  // a row that is not whole blocks: keep a float type
    jobs_.push_back(Job{name, t, std::move(ne), 0.0, std_dev, experts, {}, {}});
  }
  // F32 vector or matrix with the given mean and std (norms, router, bias).
  void f32(const std::string& name, std::vector<int64_t> ne, double mean, double std_dev) {
    jobs_.push_back(Job{name, DType::F32, std::move(ne), mean, std_dev, false, {}, {}});
  }
  void norm(const std::string& name, int64_t n) { f32(name, {n}, 1.0, kNormJitter); }
  // Fixed F32 values (rope_freqs).
  void values(const std::string& name, const std::vector<float>& v) {
    Job j{name, DType::F32, {int64_t(v.size())}, 0.0, 0.0, false, {}, {}};
    j.fixed = v;
    jobs_.push_back(std::move(j));
  }

  // Generates everything and adds it to the writer.
  void emit(gguf::Writer& writer, TinyModelSummary* summary) {
    std::vector<std::exception_ptr> errors(jobs_.size());
    std::atomic<size_t> next{0};
    auto work = [&]() {
      for (size_t k = next++; k < jobs_.size(); k = next++) {
        try {
          fill(jobs_[k]);
        } catch (...) {
          errors[k] = std::current_exception();
        }
      }
    };
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    const size_t n_threads = std::min<size_t>({hw, 16, jobs_.size()});
    std::vector<std::thread> threads;
    for (size_t t = 1; t < n_threads; ++t) threads.emplace_back(work);
    work();
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
    uint64_t n_params = 0;
    for (Job& j : jobs_) {
      int64_t n = 1;
      for (int64_t d : j.ne) n *= d;
      n_params += uint64_t(n);
      writer.add_tensor(j.name, uint32_t(j.type), j.ne, std::move(j.data));
    }
    if (summary) {
      summary->params = n_params;
      summary->n_tensors = int32_t(jobs_.size());
    }
  }

 private:
  struct Job {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    double mean, std_dev;
    bool experts;
    std::vector<float> fixed;   // values() tensors
    std::vector<uint8_t> data;  // filled by fill()
  };

  void fill(Job& j) const {
    if (!j.fixed.empty()) {
      j.data.resize(j.fixed.size() * 4);
      std::memcpy(j.data.data(), j.fixed.data(), j.data.size());
      return;
    }
    const int64_t row_len = j.ne[0];
    int64_t n_rows = 1;
    for (size_t d = 1; d < j.ne.size(); ++d) n_rows *= j.ne[d];
    const size_t row_size = *row_bytes(j.type, row_len);
    j.data.resize(row_size * size_t(n_rows));

    // Routed experts: value = std · (sqrt(1 - d²)·base + d·own), with one base matrix
    // {ne0, ne1} (its own stream) shared by all experts.
    std::vector<float> base;
    double base_w = 0.0, own_w = 1.0;
    if (j.experts && j.ne.size() == 3) {
      Rng brng = tensor_rng(seed_, j.name + "#base");
      base.resize(size_t(j.ne[0] * j.ne[1]));
      for (float& b : base) b = float(brng.gauss());
      base_w = std::sqrt(1.0 - kExpertDiversity * kExpertDiversity);
      own_w = kExpertDiversity;
    }
    const int64_t rows_per_expert = base.empty() ? 0 : j.ne[1];

    Rng rng = tensor_rng(seed_, j.name);
    std::vector<float> row(static_cast<size_t>(row_len));
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* b = base.empty() ? nullptr : base.data() + (r % rows_per_expert) * row_len;
      for (int64_t i = 0; i < row_len; ++i) {
        double z = rng.gauss();
        if (b) z = base_w * double(b[i]) + own_w * z;
        row[size_t(i)] = float(j.mean + j.std_dev * z);
      }
      if (!quantize_row_ref(j.type, row.data(), j.data.data() + size_t(r) * row_size, row_len))
        throw std::runtime_error("make-tiny: cannot encode tensor '" + j.name + "' as " + dtype_name(j.type));
    }
  }

  uint64_t seed_;
  DType matrix_type_;
  std::vector<Job> jobs_;
};

// The std of a matrix applied to fan_in inputs: gain / sqrt(fan_in).
double fan_std(int64_t fan_in, double gain = 1.0) { return gain / std::sqrt(double(fan_in)); }

uint32_t file_type_of(DType t) {
  switch (t) {  // llama.cpp's LLAMA_FTYPE_ALL_F32 / MOSTLY_F16 / MOSTLY_Q8_0 / MOSTLY_BF16
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q8_0: return 7;
    case DType::BF16: return 32;
    default: throw std::invalid_argument(std::string("make-tiny: unsupported weight type ") + dtype_name(t) +
                                         " (expected f32, f16, bf16 or q8_0)");
  }
}

std::string default_name(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
  return name.empty() ? "step35-tiny" : name;
}

Shape preset_shape(const std::string& preset) {
  if (preset == "tiny") return kTiny;
  if (preset == "bench") return kBench;
  throw std::invalid_argument("make-tiny: unknown preset '" + preset + "' (expected tiny or bench)");
}

// Fails on an unwritable path before seconds (bench: a minute) go into weights.
void check_writable(const std::string& path) {
  std::FILE* probe = std::fopen(path.c_str(), "wb");
  if (!probe) throw std::runtime_error("cannot create '" + path + "': " + std::strerror(errno));
  std::fclose(probe);
}

// The per-block layout of a shape, trunk then MTP blocks (architecture.md "Per-layer schedule").
struct BlockSchedule {
  std::vector<bool> is_swa, is_moe;
  std::vector<int32_t> n_head, n_head_kv;
  std::vector<float> clamp_exp, clamp_shexp;
};

BlockSchedule block_schedule(const Shape& S) {
  const size_t n_blocks = static_cast<size_t>(S.n_layer + S.n_mtp);
  BlockSchedule b;
  b.is_swa.resize(n_blocks);
  b.is_moe.resize(n_blocks);
  b.n_head.resize(n_blocks);
  b.n_head_kv.assign(n_blocks, S.n_head_kv);
  b.clamp_exp.assign(n_blocks, 0.0f);
  b.clamp_shexp.assign(n_blocks, 0.0f);
  for (int32_t il = 0; il < S.n_layer + S.n_mtp; ++il) {
    const bool mtp = il >= S.n_layer;
    const bool swa = (mtp && S.mtp_swa) || (S.swa_period > 0 && il % S.swa_period != 0);
    b.is_swa[size_t(il)] = swa;
    b.is_moe[size_t(il)] = mtp ? !S.mtp_dense : il >= S.n_dense;
    b.n_head[size_t(il)] = swa ? S.n_head_swa : S.n_head_full;
    // The release clamps the routed experts of its last two trunk layers and the shared
    // expert of the last one (architecture.md "Hyperparameters"); MTP blocks have none.
    if (!mtp && b.is_moe[size_t(il)]) {
      if (il >= S.n_layer - 2) b.clamp_exp[size_t(il)] = kClampExp;
      if (il == S.n_layer - 1) b.clamp_shexp[size_t(il)] = kClampShexp;
    }
  }
  return b;
}

void set_general_keys(gguf::Writer& w, const TinyModelOptions& options, const std::string& name, uint32_t file_type) {
  w.set_str("general.architecture", "step35");
  w.set_str("general.type", "model");
  w.set_str("general.name", name);
  w.set_str("general.description", "synthetic random-weight step35 model (step35 make-tiny --preset " +
                                       options.preset + " --seed " + std::to_string(options.seed) + " --type " +
                                       dtype_name(options.weight_type) + ")");
  w.set_u32("general.alignment", 32);
  w.set_u32("general.file_type", file_type);
  w.set_u32("general.quantization_version", 2);
}

// The step35.* keys (architecture.md "Hyperparameters").
void set_hparam_keys(gguf::Writer& w, const Shape& S, const BlockSchedule& blocks) {
  auto K = [](const char* k) { return std::string("step35.") + k; };
  w.set_u32(K("context_length"), uint32_t(S.n_ctx));
  w.set_u32(K("embedding_length"), uint32_t(S.n_embd));
  w.set_u32(K("block_count"), uint32_t(S.n_layer + S.n_mtp));
  w.set_u32(K("nextn_predict_layers"), uint32_t(S.n_mtp));
  w.set_u32(K("feed_forward_length"), uint32_t(S.n_ff));
  w.set_arr_i32(K("attention.head_count"), blocks.n_head);
  w.set_arr_i32(K("attention.head_count_kv"), blocks.n_head_kv);
  w.set_u32(K("attention.key_length"), uint32_t(S.head_dim));
  w.set_u32(K("attention.value_length"), uint32_t(S.head_dim));
  w.set_f32(K("attention.layer_norm_rms_epsilon"), kRmsEps);
  w.set_u32(K("attention.sliding_window"), uint32_t(S.swa_window));
  w.set_arr_bool(K("attention.sliding_window_pattern"), blocks.is_swa);
  w.set_f32(K("rope.freq_base"), kRopeBase);
  w.set_f32(K("rope.freq_base_swa"), kRopeBaseSwa);
  w.set_u32(K("expert_count"), uint32_t(S.n_expert));
  w.set_u32(K("expert_used_count"), uint32_t(S.n_expert_used));
  w.set_u32(K("expert_feed_forward_length"), uint32_t(S.n_ff_exp));
  w.set_u32(K("expert_shared_feed_forward_length"), uint32_t(S.n_ff_shexp));
  w.set_u32(K("expert_gating_func"), 2);  // sigmoid
  w.set_f32(K("expert_weights_scale"), kExpertWeightsScale);
  w.set_bool(K("expert_weights_norm"), true);
  w.set_arr_f32(K("swiglu_clamp_exp"), blocks.clamp_exp);
  w.set_arr_f32(K("swiglu_clamp_shexp"), blocks.clamp_shexp);
  w.set_u32(K("leading_dense_block_count"), uint32_t(S.n_dense));
  w.set_u32(K("moe_every_n_layers"), 1);
}

void set_tokenizer_keys(gguf::Writer& w, const Vocab& vocab) {
  w.set_str("tokenizer.ggml.model", "gpt2");
  w.set_str("tokenizer.ggml.pre", "deepseek-v3");
  w.set_arr_str("tokenizer.ggml.tokens", vocab.tokens);
  w.set_arr_i32("tokenizer.ggml.token_type", vocab.types);
  w.set_arr_str("tokenizer.ggml.merges", vocab.merges);
  w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(vocab.bos));
  w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(vocab.eos));
  w.set_u32("tokenizer.ggml.eot_token_id", uint32_t(vocab.im_end));
  w.set_u32("tokenizer.ggml.padding_token_id", uint32_t(vocab.pad));
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  w.set_str("tokenizer.chat_template", kChatTemplate);
}

// Block il's tensors (architecture.md "GGUF: keys and tensors"); V: the vocabulary size.
// TinyModelOptions::hot_experts: block il's selection bias, -hot * ln(1 + rank) with the
// experts ranked in an order drawn from (seed, il).
std::vector<float> hot_expert_bias(int64_t n_expert, double hot, uint64_t seed, int32_t il) {
  std::vector<int64_t> order(static_cast<size_t>(n_expert));
  for (int64_t e = 0; e < n_expert; ++e) order[size_t(e)] = e;
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + uint64_t(il) + 1;
  for (int64_t i = n_expert - 1; i > 0; --i) {  // Fisher-Yates with a 64-bit LCG
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(order[size_t(i)], order[size_t((state >> 33) % uint64_t(i + 1))]);
  }
  std::vector<float> bias(static_cast<size_t>(n_expert));
  for (int64_t r = 0; r < n_expert; ++r) bias[size_t(order[size_t(r)])] = float(-hot * std::log1p(double(r)));
  return bias;
}

void declare_block_tensors(TensorEmitter& T, const Shape& S, const BlockSchedule& blocks, int32_t il, int64_t V,
                           const TinyModelOptions& o) {
  const int64_t E = S.n_embd, D = S.head_dim;
  const int64_t H = blocks.n_head[size_t(il)], G = blocks.n_head_kv[size_t(il)];
  T.norm(block_tensor_name(il, "attn_norm.weight"), E);
  T.matrix(block_tensor_name(il, "attn_q.weight"), {E, H * D}, fan_std(E));
  T.matrix(block_tensor_name(il, "attn_k.weight"), {E, G * D}, fan_std(E));
  T.matrix(block_tensor_name(il, "attn_v.weight"), {E, G * D}, fan_std(E));
  T.norm(block_tensor_name(il, "attn_q_norm.weight"), D);
  T.norm(block_tensor_name(il, "attn_k_norm.weight"), D);
  T.matrix(block_tensor_name(il, "attn_gate.weight"), {E, H}, fan_std(E));
  T.matrix(block_tensor_name(il, "attn_output.weight"), {H * D, E}, fan_std(H * D, kResidGain));
  T.norm(block_tensor_name(il, "ffn_norm.weight"), E);
  if (blocks.is_moe[size_t(il)]) {
    const int64_t X = S.n_expert, F = S.n_ff_exp, FS = S.n_ff_shexp;
    T.f32(block_tensor_name(il, "ffn_gate_inp.weight"), {E, X}, 0.0, fan_std(E, kRouterGain));
    if (o.hot_experts > 0)
      T.values(block_tensor_name(il, "exp_probs_b.bias"), hot_expert_bias(X, o.hot_experts, o.seed, il));
    else
      T.f32(block_tensor_name(il, "exp_probs_b.bias"), {X}, 0.0, kRouterBiasStd);
    T.matrix(block_tensor_name(il, "ffn_gate_exps.weight"), {E, F, X}, fan_std(E), true);
    T.matrix(block_tensor_name(il, "ffn_up_exps.weight"), {E, F, X}, fan_std(E), true);
    T.matrix(block_tensor_name(il, "ffn_down_exps.weight"), {F, E, X}, fan_std(F, kResidGain), true);
    T.matrix(block_tensor_name(il, "ffn_gate_shexp.weight"), {E, FS}, fan_std(E));
    T.matrix(block_tensor_name(il, "ffn_up_shexp.weight"), {E, FS}, fan_std(E));
    T.matrix(block_tensor_name(il, "ffn_down_shexp.weight"), {FS, E}, fan_std(FS, kResidGain));
  } else {
    T.matrix(block_tensor_name(il, "ffn_gate.weight"), {E, S.n_ff}, fan_std(E));
    T.matrix(block_tensor_name(il, "ffn_up.weight"), {E, S.n_ff}, fan_std(E));
    T.matrix(block_tensor_name(il, "ffn_down.weight"), {S.n_ff, E}, fan_std(S.n_ff, kResidGain));
  }
  if (il >= S.n_layer) {  // MTP block (architecture.md "MTP heads")
    T.matrix(block_tensor_name(il, "nextn.eh_proj.weight"), {2 * E, E}, fan_std(2 * E));
    T.norm(block_tensor_name(il, "nextn.enorm.weight"), E);
    T.norm(block_tensor_name(il, "nextn.hnorm.weight"), E);
    T.norm(block_tensor_name(il, "nextn.shared_head_norm.weight"), E);
    T.matrix(block_tensor_name(il, "nextn.shared_head_head.weight"), {E, V}, fan_std(E, kOutGain));
  }
}

// All tensors: globals first, then each block, then the output head.
void declare_tensors(TensorEmitter& T, const Shape& S, const BlockSchedule& blocks, int64_t V,
                     const TinyModelOptions& o) {
  const int64_t E = S.n_embd;
  T.matrix("token_embd.weight", {E, V}, kEmbdStd);
  T.values("rope_freqs.weight", llama3_rope_factors(S.head_dim, kRopeBase, S.rope_orig_ctx));
  for (int32_t il = 0; il < S.n_layer + S.n_mtp; ++il) declare_block_tensors(T, S, blocks, il, V, o);
  T.norm("output_norm.weight", E);
  T.matrix("output.weight", {E, V}, fan_std(E, kOutGain));
}

}  // namespace

void make_tiny_model(const TinyModelOptions& options, const std::string& path, TinyModelSummary* summary) {
  const Shape S = preset_shape(options.preset);
  const uint32_t file_type = file_type_of(options.weight_type);
  if (path.empty()) throw std::invalid_argument("make-tiny: empty output path");
  check_writable(path);
  try {
    const BlockSchedule blocks = block_schedule(S);
    const Vocab vocab = build_vocab(S.n_merges, S.vocab_pad);
    const std::string name = options.name.empty() ? default_name(path) : options.name;

    gguf::Writer w(32);
    set_general_keys(w, options, name, file_type);
    set_hparam_keys(w, S, blocks);
    set_tokenizer_keys(w, vocab);
    TensorEmitter T(options.seed, options.weight_type);
    declare_tensors(T, S, blocks, int64_t(vocab.tokens.size()), options);

    T.emit(w, summary);
    w.write(path);
    if (summary) {
      summary->bytes = std::filesystem::file_size(path);
      summary->n_layer = S.n_layer;
      summary->n_mtp = S.n_mtp;
      summary->n_vocab = int32_t(vocab.tokens.size());
      summary->n_merges = int32_t(vocab.merges.size());
    }
  } catch (...) {
    std::remove(path.c_str());  // no half-made file under the requested name
    throw;
  }
}

}  // namespace step35
