// Runs one MTP block the way llama.cpp's goldens were made (tests/test_mtp.cpp,
// tests/test_mtp_sidecar.cpp): `tokens` in one batch with a fresh F32 KV cache, fed `hnextn`
// (the trunk's hidden states) shifted by one position, zeros at position 0.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "exec/thread_pool.h"
#include "model/step35.h"
#include "model/workspace.h"

namespace step35::testing {

inline BatchOutput run_mtp_head(const Model& model, int head, const std::vector<int32_t>& tokens,
                                const std::vector<float>& hnextn, Precision precision) {
  const size_t T = tokens.size(), E = size_t(model.hparams().n_embd);
  std::vector<float> h_in(T * E, 0.0f);
  std::copy(hnextn.begin(), hnextn.end() - long(E), h_in.begin() + long(E));
  ThreadPool pool(2);
  KvPool kv({model.mtp_kv_layer(head)}, model.hparams().swa_window, KvPool::kDefaultBlockSize, 4, 4, 0,
            KvTypes::f32());  // the goldens' cache
  KvSeq seq;
  Workspace ws;
  BatchOutput out;
  SeqChunk ch;
  ch.seq = &seq;
  ch.tokens = tokens.data();
  ch.n_tokens = int32_t(T);
  ch.logits = LogitRows::All;
  ch.want_hidden = true;
  ForwardOptions opts;
  opts.precision = precision;
  model.forward_mtp(head, kv, {ch}, h_in.data(), out, ws, pool, opts);
  EXPECT_EQ(seq.n_pos, int32_t(T));
  return out;
}

}  // namespace step35::testing
