// Paged KV cache: block accounting, sliding-window release, rollback, reference counts, and
// the bytes of each cache type.
#include <gtest/gtest.h>

#include <set>

#include "exec/kv_cache.h"
#include "tensor/kv_kernels.h"

using namespace step35;

namespace {

std::vector<KvLayerShape> shapes() {
  // full, swa, swa, full (as step35's pattern), 2 KV heads of 4 dims.
  return {{false, 2, 4, 4}, {true, 2, 4, 4}, {true, 1, 4, 4}, {false, 2, 4, 4}};
}

TEST(KvPool, BlocksForSequenceCoverWindowAndBatch) {
  const auto [full, swa] = KvPool::blocks_for_sequence(shapes(), 1000, 16, 8, 4, 0);
  EXPECT_EQ(full, 250);
  EXPECT_EQ(swa, (16 - 1 + 8 + 3) / 4 + 1);
  const auto [full2, swa2] = KvPool::blocks_for_sequence(shapes(), 10, 16, 8, 4, 0);
  EXPECT_EQ(full2, 3);
  EXPECT_EQ(swa2, 3);  // never more than the full count
  const auto [fb, sb] = KvPool::block_bytes(shapes(), 4, KvTypes::f32());
  EXPECT_EQ(fb, size_t(2 * 4 * 2 * 2 * 4 * 4));  // 2 layers x 4 positions x (K+V) x 2 heads x 4 dims x 4 bytes
  EXPECT_EQ(sb, size_t(4 * (2 + 1) * 2 * 4 * 4));
  const auto [fb16, sb16] = KvPool::block_bytes(shapes(), 4, KvTypes{});  // f16 by default
  EXPECT_EQ(fb16, fb / 2);
  EXPECT_EQ(sb16, sb / 2);
}

// Bytes per position as llama.cpp's cache holds them: the released model's 12 full-attention
// layers of 8 KV heads x 128 (issue 21: 96 KiB per position in F32).
TEST(KvPool, BytesPerPositionOfEachType) {
  const KvLayerShape full{false, 8, 128, 128};
  auto per_position = [&](DType k, DType v) { return 12 * KvPool::position_bytes(full, {k, v}); };
  EXPECT_EQ(per_position(DType::F32, DType::F32), size_t(96 * 1024));
  EXPECT_EQ(per_position(DType::F16, DType::F16), size_t(48 * 1024));
  EXPECT_EQ(per_position(DType::BF16, DType::BF16), size_t(48 * 1024));
  EXPECT_EQ(per_position(DType::Q8_0, DType::Q8_0), size_t(12 * 8 * 2 * 4 * 34));  // 4 blocks of 34 bytes per head row
  EXPECT_EQ(per_position(DType::Q4_0, DType::Q4_0), size_t(12 * 8 * 2 * 4 * 18));
  EXPECT_EQ(per_position(DType::Q8_0, DType::F16), size_t(12 * 8 * (4 * 34 + 256)));
  // A pool of those types maps exactly its blocks' bytes.
  KvPool pool({full, {true, 8, 128, 128}}, 512, 32, 10, 3, 0, {DType::Q8_0, DType::Q4_0});
  EXPECT_EQ(pool.bytes(), size_t(13 * 32 * 8 * (4 * 34 + 4 * 18)));
  EXPECT_EQ(pool.k_head_bytes(0), size_t(32 * 4 * 34));
  EXPECT_EQ(pool.v_head_bytes(1), size_t(32 * 4 * 18));
}

TEST(KvPool, RejectsTypesThatCannotHoldTheHeads) {
  try {
    KvPool pool(shapes(), 8, 4, 4, 4, 0, {DType::Q8_0, DType::F16});  // heads of 4 values
    FAIL() << "accepted q8_0 keys of 4 values";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0 needs key heads that are a multiple of 32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(KvPool(shapes(), 8, 4, 4, 4, 0, {DType::F16, DType::Q4_K}), std::invalid_argument);
  EXPECT_THROW(KvPool::block_bytes(shapes(), 4, {DType::Q4_0, DType::Q4_0}), std::invalid_argument);
  EXPECT_EQ(kv_type_from_name("q8_0"), DType::Q8_0);
  EXPECT_EQ(kv_type_from_name("bf16"), DType::BF16);
  EXPECT_FALSE(kv_type_from_name("q4_K").has_value());
  EXPECT_FALSE(kv_type_from_name("F16").has_value());  // llama.cpp's spelling only
}

TEST(KvPool, ReserveWriteTrimAndFree) {
  KvPool pool(shapes(), 8, 4, 16, 16, 0);
  KvSeq seq;
  ASSERT_TRUE(pool.reserve(seq, 10));
  EXPECT_EQ(seq.full_blocks.size(), 3u);
  EXPECT_EQ(seq.swa_blocks.size(), 3u);
  // Every (layer, head, position) key and value lands in its own bytes.
  auto row = [](size_t l, int32_t g, int32_t p, float sign) {
    std::vector<float> r(4);
    for (int i = 0; i < 4; ++i) r[size_t(i)] = sign * (float(100 * int(l) + 30 * g + 2 * p) + 0.25f * float(i));  // exact in F16
    return r;
  };
  for (int32_t p = 0; p < 10; ++p)
    for (size_t l = 0; l < 4; ++l)
      for (int32_t g = 0; g < pool.shape(l).n_head_kv; ++g) {
        const int32_t b = pool.block_of(seq, l, p);
        kernels::kv_store_key(DType::F16, row(l, g, p, 1).data(), 4, pool.k_head(l, b, g), 4, p % 4);
        kernels::kv_store_value(DType::F16, row(l, g, p, -1).data(), 4, pool.v_head(l, b, g), 4, p % 4);
      }
  seq.n_pos = 10;
  std::vector<float> got(4);
  for (int32_t p = 0; p < 10; ++p)
    for (size_t l = 0; l < 4; ++l)
      for (int32_t g = 0; g < pool.shape(l).n_head_kv; ++g) {
        const int32_t b = pool.block_of(seq, l, p);
        kernels::kv_load_key(DType::F16, pool.k_head(l, b, g), 4, p % 4, 4, got.data());
        EXPECT_EQ(got, row(l, g, p, 1)) << l << " " << g << " " << p;
        kernels::kv_load_value(DType::F16, pool.v_head(l, b, g), 4, p % 4, 4, got.data());
        EXPECT_EQ(got, row(l, g, p, -1)) << l << " " << g << " " << p;
      }
  // Window 8: the next query (position 10) sees 3..10, so block 0 (positions 0-3) stays.
  pool.trim_swa(seq);
  EXPECT_GE(seq.swa_blocks[0], 0);
  ASSERT_TRUE(pool.reserve(seq, 14));
  seq.n_pos = 14;  // next query 14 sees 7..14: blocks 0 (0-3) can go, block 1 (4-7) stays
  pool.trim_swa(seq);
  EXPECT_EQ(seq.swa_blocks[0], -1);
  EXPECT_GE(seq.swa_blocks[1], 0);
  EXPECT_EQ(pool.n_free(KvKind::Swa), 16 - 3);
  // Rolling back to 12 needs 5..11: still held. Back to 2 needs 0..1: released.
  EXPECT_TRUE(pool.can_truncate(seq, 12));
  EXPECT_FALSE(pool.can_truncate(seq, 2));
  EXPECT_THROW(pool.truncate(seq, 2), std::logic_error);
  pool.truncate(seq, 12);
  EXPECT_EQ(seq.n_pos, 12);
  EXPECT_EQ(seq.full_blocks.size(), 3u);
  pool.free_seq(seq);
  EXPECT_EQ(pool.n_free(KvKind::Full), 16);
  EXPECT_EQ(pool.n_free(KvKind::Swa), 16);
}

// Pages are committed when a block is first written, and stay committed once it is freed:
// the gauge the server reports (and the agent soak subtracts from the RSS it checks).
TEST(KvPool, ResidentBytesGrowWithBlocksWrittenAndStayWhenFreed) {
  const std::vector<KvLayerShape> wide = {{false, 4, 128, 128}, {true, 4, 128, 128}};
  KvPool pool(wide, 64, 32, 64, 64, 0, KvTypes{DType::F32, DType::F32});
  const size_t block = KvPool::block_bytes(wide, 32, pool.types()).first;  // 128 KiB: whole pages
  EXPECT_EQ(pool.resident_bytes(), 0u);
  KvSeq seq;
  ASSERT_TRUE(pool.reserve(seq, 3 * 32));
  for (int32_t p = 0; p < 3 * 32; ++p)
    for (size_t l = 0; l < 2; ++l)
      for (int32_t g = 0; g < 4; ++g) {
        const int32_t b = pool.block_of(seq, l, p);
        const std::vector<float> row(128, float(p));
        kernels::kv_store_key(DType::F32, row.data(), 128, pool.k_head(l, b, g), 128, p % 32);
        kernels::kv_store_value(DType::F32, row.data(), 128, pool.v_head(l, b, g), 128, p % 32);
      }
  EXPECT_EQ(pool.resident_bytes(), 2 * 3 * block);  // three blocks of each kind
  pool.free_seq(seq);
  EXPECT_EQ(pool.resident_bytes(), 2 * 3 * block);
  EXPECT_LE(pool.resident_bytes(), pool.bytes());
}

TEST(KvPool, KeepBackHoldsRollbackMargin) {
  KvPool pool(shapes(), 8, 4, 16, 16, 3);
  KvSeq seq;
  ASSERT_TRUE(pool.reserve(seq, 16));
  seq.n_pos = 16;
  pool.trim_swa(seq);
  // Next query may be at 16 - 3 = 13, which sees 6..13: block 1 (4-7) must stay.
  EXPECT_GE(seq.swa_blocks[1], 0);
  EXPECT_TRUE(pool.can_truncate(seq, 13));
  pool.free_seq(seq);
}

TEST(KvPool, ReserveFailsCleanlyWhenExhausted) {
  KvPool pool(shapes(), 8, 4, 4, 4, 0);
  KvSeq a, b;
  ASSERT_TRUE(pool.reserve(a, 12));  // 3 of 4 blocks
  EXPECT_FALSE(pool.reserve(b, 8));  // needs 2
  EXPECT_TRUE(b.full_blocks.empty());
  EXPECT_EQ(pool.n_free(KvKind::Full), 1);
  ASSERT_TRUE(pool.reserve(b, 4));
  pool.free_seq(a);
  pool.free_seq(b);
  EXPECT_EQ(pool.n_free(KvKind::Full), 4);
}

TEST(KvPool, ReferenceCountsShareBlocks) {
  KvPool pool(shapes(), 8, 4, 4, 4, 0);
  const int32_t b = pool.alloc(KvKind::Full);
  ASSERT_GE(b, 0);
  pool.retain(KvKind::Full, b);
  EXPECT_EQ(pool.refcount(KvKind::Full, b), 2);
  pool.release(KvKind::Full, b);
  EXPECT_EQ(pool.n_free(KvKind::Full), 3);
  pool.release(KvKind::Full, b);
  EXPECT_EQ(pool.n_free(KvKind::Full), 4);
  EXPECT_THROW(pool.release(KvKind::Full, b), std::logic_error);
  EXPECT_THROW(pool.retain(KvKind::Full, 99), std::logic_error);
}

TEST(KvCache, DescribesItsLayout) {
  KvCache cache(shapes(), 100, 8, 16);
  EXPECT_EQ(cache.capacity(0), 100);
  EXPECT_LT(cache.capacity(1), 100);
  EXPECT_GE(cache.capacity(1), 8 + 16 - 1);
  EXPECT_NE(cache.describe().find("SWA"), std::string::npos);
  EXPECT_NE(cache.describe().find("K f16, V f16"), std::string::npos) << cache.describe();
  KvCache f32(shapes(), 100, 8, 16, 0, KvTypes::f32());
  EXPECT_EQ(f32.bytes(), 2 * cache.bytes());
  EXPECT_NE(f32.describe().find("K f32, V f32"), std::string::npos) << f32.describe();
}

}  // namespace
