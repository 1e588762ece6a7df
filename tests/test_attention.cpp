// Streaming attention over the typed KV cache (attention/attention.h): against the plain
// reference (every score, softmax and weighted sum in double) at several depths, head counts,
// head sizes, cache types and windows; bit-identical whatever the thread count and whatever
// else is in the batch (a decoded token, split by spans, against the same token in a prefill).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attention/attention.h"
#include "exec/thread_pool.h"
#include "tensor/kernels.h"

namespace step35 {
namespace {

struct Geometry {
  int32_t n_head, n_head_kv, head_dim;
  bool is_swa;
  int32_t window;
};

struct Cache {
  AttentionLayer layer;
  std::unique_ptr<KvPool> pool;
  std::vector<KvSeq> seqs;
};

// A pool of one layer with `depths[i]` random positions written for sequence i.
Cache make_cache(const Geometry& geo, KvTypes types, const std::vector<int32_t>& depths, uint32_t seed) {
  Cache c;
  c.layer = {0, geo.n_head, geo.n_head_kv, geo.head_dim, geo.head_dim, geo.is_swa, geo.window};
  int32_t most = 1;
  for (int32_t d : depths) most = std::max(most, d);
  const int64_t blocks = (int64_t(most) + KvPool::kDefaultBlockSize - 1) / KvPool::kDefaultBlockSize * int64_t(depths.size());
  c.pool = std::make_unique<KvPool>(std::vector<KvLayerShape>{{geo.is_swa, geo.n_head_kv, geo.head_dim, geo.head_dim}},
                                    geo.window, KvPool::kDefaultBlockSize, geo.is_swa ? 0 : blocks,
                                    geo.is_swa ? blocks : 0, 0, types);
  c.seqs.resize(depths.size());
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  ThreadPool pool(1);
  for (size_t s = 0; s < depths.size(); ++s) {
    const int32_t n = depths[s];
    EXPECT_TRUE(c.pool->reserve(c.seqs[s], n));
    std::vector<SeqChunk> chunks(1);
    chunks[0].seq = &c.seqs[s];
    std::vector<int32_t> slot(static_cast<size_t>(n)), chunk_of(static_cast<size_t>(n), 0);
    for (int32_t i = 0; i < n; ++i) slot[size_t(i)] = i;
    std::vector<float> k(size_t(n) * size_t(geo.n_head_kv * geo.head_dim)), v(k.size());
    for (float& f : k) f = nd(rng);
    for (float& f : v) f = nd(rng);
    AttentionBatch b{&chunks, n, slot.data(), chunk_of.data()};
    store_kv(*c.pool, c.layer, b, k.data(), v.data(), pool);
    c.seqs[s].n_pos = n;
  }
  return c;
}

// The queries of the last n_q positions of each listed sequence, in one batch.
struct Queries {
  std::vector<SeqChunk> chunks;
  std::vector<int32_t> slot, chunk_of;
  std::vector<float> q;
  AttentionBatch batch() const { return {&chunks, int64_t(slot.size()), slot.data(), chunk_of.data()}; }
};

Queries make_queries(Cache& c, const std::vector<std::pair<size_t, int32_t>>& seq_and_count, uint32_t seed) {
  Queries Q;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  for (const auto& [s, n_q] : seq_and_count) {
    SeqChunk ch;
    ch.seq = &c.seqs[s];
    ch.n_tokens = n_q;
    Q.chunks.push_back(ch);
    for (int32_t i = 0; i < n_q; ++i) {
      Q.slot.push_back(c.seqs[s].n_pos - n_q + i);
      Q.chunk_of.push_back(int32_t(Q.chunks.size() - 1));
    }
  }
  Q.q.resize(Q.slot.size() * size_t(c.layer.n_head * c.layer.head_dim_k));
  for (float& f : Q.q) f = nd(rng);
  return Q;
}

std::vector<float> run(Cache& c, const Queries& Q, int threads) {
  ThreadPool pool(threads);
  AttentionScratch scratch;
  std::vector<float> o(Q.slot.size() * size_t(c.layer.n_head * c.layer.head_dim_v), -7.0f);
  attend(*c.pool, c.layer, Q.batch(), Q.q.data(), o.data(), pool, scratch);
  return o;
}

struct Case {
  Geometry geo;
  KvTypes types;
  std::vector<int32_t> depths;
};

std::string type_label(KvTypes t) { return std::string(dtype_name(t.k)) + "_" + dtype_name(t.v); }

class Attention : public ::testing::TestWithParam<Case> {};

TEST_P(Attention, MatchesReferenceAtEveryThreadCountBitForBit) {
  const Case& cs = GetParam();
  Cache c = make_cache(cs.geo, cs.types, cs.depths, 1);
  std::vector<std::pair<size_t, int32_t>> which;
  for (size_t s = 0; s < cs.depths.size(); ++s) which.push_back({s, std::min(cs.depths[s], s == 0 ? 1 : 19)});
  const Queries Q = make_queries(c, which, 2);
  std::vector<float> want(Q.slot.size() * size_t(cs.geo.n_head * cs.geo.head_dim));
  attend_reference(*c.pool, c.layer, Q.batch(), Q.q.data(), want.data());
  const std::vector<float> got1 = run(c, Q, 1);
  double max_err = 0;
  for (size_t i = 0; i < want.size(); ++i) max_err = std::max(max_err, double(std::fabs(got1[i] - want[i])));
  // Scores and sums in F32 (with the key type's query rounding, as the reference) against
  // double: a few float ulps of outputs of size ~1.
  EXPECT_LE(max_err, 2e-5);
  for (int threads : {2, 3, 4}) {
    const std::vector<float> got = run(c, Q, threads);
    ASSERT_EQ(0, std::memcmp(got.data(), got1.data(), got.size() * sizeof(float))) << threads << " threads";
  }
}

// One token's row is the same bits when it is decoded alone (one token: every span a job of
// its own and the fold after them), in a prefill chunk (tiles of tokens, spans folded as a
// job goes) and next to another sequence.
TEST_P(Attention, RowsDoNotDependOnTheirCompany) {
  const Case& cs = GetParam();
  Cache c = make_cache(cs.geo, cs.types, cs.depths, 3);
  const int32_t n_q = std::min<int32_t>(cs.depths[0], 21);
  const Queries all = make_queries(c, {{0, n_q}}, 4);
  const size_t row = size_t(cs.geo.n_head * cs.geo.head_dim);
  for (int threads : {1, 2}) {
    const std::vector<float> together = run(c, all, threads);
    for (int32_t i : {0, n_q / 2, n_q - 1}) {
      Queries one = make_queries(c, {{0, 1}}, 5);
      one.slot[0] = all.slot[size_t(i)];
      std::copy(all.q.begin() + ptrdiff_t(size_t(i) * row), all.q.begin() + ptrdiff_t(size_t(i + 1) * row), one.q.begin());
      const std::vector<float> alone = run(c, one, threads);
      ASSERT_EQ(0, std::memcmp(alone.data(), together.data() + size_t(i) * row, row * sizeof(float)))
          << "token " << i << " of " << n_q << ", " << threads << " threads";
    }
    if (cs.depths.size() > 1) {  // the same chunk with a second sequence in the batch
      Queries mixed = make_queries(c, {{1, 3}, {0, n_q}}, 6);
      std::copy(all.q.begin(), all.q.end(), mixed.q.begin() + ptrdiff_t(3 * row));
      const std::vector<float> m = run(c, mixed, threads);
      ASSERT_EQ(0, std::memcmp(m.data() + 3 * row, together.data(), together.size() * sizeof(float)));
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> v;
  const KvTypes all_types[] = {KvTypes::f32(), KvTypes{}, {DType::BF16, DType::BF16}, {DType::Q8_0, DType::Q8_0},
                               {DType::Q4_0, DType::Q4_0}, {DType::Q8_0, DType::F16}, {DType::F16, DType::Q4_0}};
  for (const KvTypes& t : all_types) {
    // Full attention, GQA 8:2, head 128 (the benchmark model's full layers): depths across
    // block and span edges, up to several spans.
    v.push_back({{16, 2, 128, false, 0}, t, {1, 33}});
    v.push_back({{16, 2, 128, false, 0}, t, {700, 300}});
    v.push_back({{8, 2, 64, false, 0}, t, {2100}});
    // Sliding window of 40 positions, 6 query heads per KV head, head 64.
    v.push_back({{12, 2, 64, true, 40}, t, {97, 5}});
    // One KV head, one query head each, head 32 (no rotation for integer caches).
    v.push_back({{1, 1, 32, false, 0}, t, {257}});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Attention, ::testing::ValuesIn(cases()), [](const ::testing::TestParamInfo<Case>& i) {
  const Case& c = i.param;
  return type_label(c.types) + "_h" + std::to_string(c.geo.n_head) + "_kv" + std::to_string(c.geo.n_head_kv) + "_d" +
         std::to_string(c.geo.head_dim) + (c.geo.is_swa ? "_swa" : "_full") + "_depth" + std::to_string(c.depths[0]);
});

// The rotation llama.cpp applies around integer caches.
TEST(AttentionRotation, FollowsLlamaCpp) {
  EXPECT_EQ(kv_rotation({DType::F16, DType::F16}, 128, 128).k, 0);
  EXPECT_EQ(kv_rotation({DType::Q8_0, DType::Q8_0}, 128, 128).k, 128);
  EXPECT_EQ(kv_rotation({DType::Q8_0, DType::Q8_0}, 128, 128).v, 64);
  EXPECT_EQ(kv_rotation({DType::Q4_0, DType::F16}, 192, 192).k, 64);  // largest power of two >= 64 dividing 192
  EXPECT_EQ(kv_rotation({DType::Q4_0, DType::F16}, 192, 192).v, 0);
  EXPECT_EQ(kv_rotation({DType::Q8_0, DType::Q8_0}, 32, 32).k, 0);  // not a multiple of 64: none
}

}  // namespace
}  // namespace step35
