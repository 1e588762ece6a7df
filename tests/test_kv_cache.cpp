// Paged KV cache: block accounting, sliding-window release, rollback and reference counts.
#include <gtest/gtest.h>

#include "exec/kv_cache.h"

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
  const auto [fb, sb] = KvPool::block_bytes(shapes(), 4);
  EXPECT_EQ(fb, size_t(2 * 4 * 2 * 2 * 4 * 4));  // 2 layers x 4 positions x (K+V) x 2 heads x 4 dims x 4 bytes
  EXPECT_EQ(sb, size_t(4 * (2 + 1) * 2 * 4 * 4));
}

TEST(KvPool, ReserveWriteTrimAndFree) {
  KvPool pool(shapes(), 8, 4, 16, 16, 0);
  KvSeq seq;
  ASSERT_TRUE(pool.reserve(seq, 10));
  EXPECT_EQ(seq.full_blocks.size(), 3u);
  EXPECT_EQ(seq.swa_blocks.size(), 3u);
  for (int32_t p = 0; p < 10; ++p)
    for (size_t l = 0; l < 4; ++l) {
      pool.k(seq, l, p)[0] = float(100 * l + p);
      pool.v(seq, l, p)[1] = -float(100 * l + p);
    }
  seq.n_pos = 10;
  for (int32_t p = 0; p < 10; ++p)
    for (size_t l = 0; l < 4; ++l) {
      EXPECT_EQ(pool.k(seq, l, p)[0], float(100 * l + p));
      EXPECT_EQ(pool.v(seq, l, p)[1], -float(100 * l + p));
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
}

}  // namespace
