#include "attention/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "exec/thread_pool.h"
#include "tensor/kernels.h"
#include "tensor/kv_kernels.h"

namespace step35 {

namespace {

// Runs fn(i) for i < n, on the pool when there is more than one item and thread.
template <typename Fn>
void for_each_item(int64_t n, ThreadPool& pool, Fn&& fn) {
  if (n <= 1 || pool.n_threads() == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  pool.parallel_stealing(n, [&](int64_t i, int) { fn(i); });
}

int32_t rotation_chunk(int32_t head_dim, bool first_power_only) {
  if (head_dim % 64 != 0) return 0;
  if (first_power_only) return 64;
  int32_t n = 64;
  while (head_dim % (2 * n) == 0) n *= 2;
  return n;
}

// A row's running softmax state over part of its positions: max, sum of exps, and the
// weighted sum of values (acc, head_dim_v floats kept by the caller).
struct RowState {
  float m = -INFINITY;
  float l = 0.0f;
};

// F <- F (+) P: the left fold of span partials, in position order.
void fold(RowState& F, float* f_acc, const RowState& P, const float* p_acc, int64_t dv) {
  if (P.l == 0.0f) return;  // the row saw nothing in that span
  if (F.l == 0.0f) {
    F = P;
    std::memcpy(f_acc, p_acc, size_t(dv) * sizeof(float));
    return;
  }
  const float m = std::max(F.m, P.m);
  const float a = std::exp(F.m - m), b = std::exp(P.m - m);
  kernels::scale_f32(a, f_acc, dv);
  kernels::axpy_f32(b, p_acc, f_acc, dv);
  F.l = F.l * a + P.l * b;
  F.m = m;
}

// The per-job view of one tile and KV head: its rows' converted queries, and which
// positions each row sees.
struct TileRows {
  const KvPool* kv;
  const AttentionLayer* L;
  const KvSeq* seq;
  DType kt, vt;
  int64_t n_rows, R;
  int32_t bs;
  float scale;
  const uint8_t* q;  // n_rows x qb
  size_t qb;
  const int32_t* first;  // per token of the tile: lowest and highest visible slot
  const int32_t* last;
};

// One span of a tile's rows: blocks [b0, b1) in order, from an empty state; states and
// accumulators (n_rows x dv) are written to st / acc.
void run_span(const TileRows& T, int64_t g, int64_t b0, int64_t b1, RowState* st, float* acc, float* s) {
  const int64_t dv = T.L->head_dim_v, d = T.L->head_dim_k;
  const int32_t bs = T.bs;
  for (int64_t r = 0; r < T.n_rows; ++r) st[r] = RowState{};
  std::fill(acc, acc + T.n_rows * dv, 0.0f);
  int32_t tile_first = T.first[0], tile_last = T.last[0];
  for (int64_t i = 1; i < T.n_rows / T.R; ++i) {
    tile_first = std::min(tile_first, T.first[i]);
    tile_last = std::max(tile_last, T.last[i]);
  }
  for (int64_t b = b0; b < b1; ++b) {
    const int32_t pos0 = int32_t(b * bs);
    if (pos0 > tile_last || pos0 + bs - 1 < tile_first) continue;
    const int32_t block = T.kv->block_of(*T.seq, T.L->kv_layer, pos0);
    const int32_t n_k = std::min(bs, tile_last - pos0 + 1);
    kernels::attn_scores(T.kt, T.q, T.qb, T.n_rows, T.kv->k_head(T.L->kv_layer, block, int32_t(g)), bs, n_k, d,
                         T.scale, s, bs);
    for (int64_t r = 0; r < T.n_rows; ++r) {
      float* sr = s + r * bs;
      const int64_t tok = r / T.R;
      const int32_t j0 = std::max(0, T.first[tok] - pos0), j1 = std::min(bs - 1, T.last[tok] - pos0);
      if (j0 > j1) {  // nothing of this block is visible to the row
        std::fill(sr, sr + bs, 0.0f);
        continue;
      }
      std::fill(sr, sr + j0, -INFINITY);
      std::fill(sr + j1 + 1, sr + bs, -INFINITY);
      const float mx = kernels::attn_row_max(sr + j0, j1 - j0 + 1);
      RowState& R = st[r];
      const float m = std::max(R.m, mx);
      if (m > R.m && R.l > 0.0f) {
        const float c = std::exp(R.m - m);
        R.l *= c;
        kernels::scale_f32(c, acc + r * dv, dv);
      }
      R.m = m;
      R.l += kernels::attn_exp_sum(sr, bs, m);
    }
    kernels::attn_accumulate(T.vt, s, bs, T.n_rows, T.kv->v_head(T.L->kv_layer, block, int32_t(g)), n_k, dv, acc,
                             dv);
  }
}

void check_layer(const KvPool& kv, const AttentionLayer& L) {
  if (L.kv_layer >= kv.n_layers()) throw std::invalid_argument("attention: KV layer out of range");
  const KvLayerShape& s = kv.shape(L.kv_layer);
  if (s.n_head_kv != L.n_head_kv || s.head_dim_k != L.head_dim_k || s.head_dim_v != L.head_dim_v ||
      s.is_swa != L.is_swa || L.n_head_kv < 1 || L.n_head % L.n_head_kv != 0)
    throw std::invalid_argument("attention: the layer does not match the KV pool's shape");
}

}  // namespace

KvRotation kv_rotation(KvTypes types, int32_t head_dim_k, int32_t head_dim_v) {
  KvRotation r;
  if (kernels::kv_type_quantized(types.k)) r.k = rotation_chunk(head_dim_k, false);
  if (kernels::kv_type_quantized(types.v)) r.v = rotation_chunk(head_dim_v, true);
  return r;
}

void store_kv(KvPool& kv, const AttentionLayer& L, const AttentionBatch& batch, float* k, float* v,
              ThreadPool& pool) {
  check_layer(kv, L);
  const KvTypes types = kv.types();
  const KvRotation rot = kv_rotation(types, L.head_dim_k, L.head_dim_v);
  const int64_t G = L.n_head_kv, D = L.head_dim_k, Dv = L.head_dim_v;
  const int32_t bs = kv.block_size();
  for_each_item(batch.n_tokens, pool, [&](int64_t t) {
    const KvSeq& seq = *(*batch.chunks)[size_t(batch.chunk_of[t])].seq;
    const int32_t p = batch.slot[t];
    const int32_t block = kv.block_of(seq, L.kv_layer, p);
    for (int64_t g = 0; g < G; ++g) {
      float* kr = k + (t * G + g) * D;
      float* vr = v + (t * G + g) * Dv;
      if (rot.k) kernels::hadamard_rows(kr, D, rot.k);
      if (rot.v) kernels::hadamard_rows(vr, Dv, rot.v);
      kernels::kv_store_key(types.k, kr, D, kv.k_head(L.kv_layer, block, int32_t(g)), bs, p % bs);
      kernels::kv_store_value(types.v, vr, Dv, kv.v_head(L.kv_layer, block, int32_t(g)), bs, p % bs);
    }
  });
}

namespace {

// One call of attend(): the layer's shapes and the batch, and the call's steps. The plan
// cuts the batch into tiles (runs of one sequence's tokens) and jobs (a tile and KV head,
// or one span of them when there are too few to keep every thread busy); each job runs its
// spans through the cache blocks and folds them; split jobs leave partials that the last
// of a (tile, head)'s jobs folds.
class AttendCall {
 public:
  using Tile = AttentionScratch::Tile;
  using Job = AttentionScratch::Job;

  AttendCall(const KvPool& kv, const AttentionLayer& L, const AttentionBatch& batch, const float* q, float* o,
             ThreadPool& pool, AttentionScratch& scr)
      : kv_(kv), L_(L), batch_(batch), q_(q), o_(o), pool_(pool), scr_(scr), types_(kv.types()),
        rot_(kv_rotation(types_, L.head_dim_k, L.head_dim_v)), T_(batch.n_tokens), H_(L.n_head), G_(L.n_head_kv),
        R_(H_ / G_), D_(L.head_dim_k), Dv_(L.head_dim_v), bs_(kv.block_size()),
        qb_(kernels::attn_query_bytes(types_.k, D_)), scale_(1.0f / std::sqrt(float(D_))) {}

  void run() {
    if (T_ <= 0) return;
    convert_queries();
    plan_tiles();
    plan_jobs();
    for_each_item(int64_t(scr_.jobs.size()), pool_, [&](int64_t j) { run_job(scr_.jobs[size_t(j)]); });
    if (rot_.v)  // back from the rotated value space (the rotation is its own inverse)
      for_each_item(T_, pool_, [&](int64_t t) { kernels::hadamard_rows(o_ + t * H_ * Dv_, H_ * Dv_, rot_.v); });
  }

 private:
  // A partial: the row's max and sum, then its Dv accumulated values.
  size_t partial_floats() const { return size_t(Dv_ + 2); }

  // Queries: rotated where the keys are, then rounded as the key type's dot product wants.
  void convert_queries() {
    scr_.queries.resize(size_t(T_ * H_) * qb_);
    for_each_item(T_, pool_, [&](int64_t t) {
      thread_local std::vector<float> row;
      row.resize(size_t(D_));
      for (int64_t h = 0; h < H_; ++h) {
        std::memcpy(row.data(), q_ + (t * H_ + h) * D_, size_t(D_) * sizeof(float));
        if (rot_.k) kernels::hadamard_rows(row.data(), D_, rot_.k);
        kernels::attn_convert_query(types_.k, row.data(), D_, scr_.queries.data() + size_t(t * H_ + h) * qb_);
      }
    });
  }

  // Tiles: runs of up to kTileTokens tokens of one chunk.
  void plan_tiles() {
    const int64_t span_pos = int64_t(kSpanBlocks) * bs_;
    scr_.tiles.clear();
    for (int64_t t = 0; t < T_;) {
      int64_t n = 1;
      while (t + n < T_ && n < kTileTokens && batch_.chunk_of[t + n] == batch_.chunk_of[t]) ++n;
      Tile tile{};
      tile.t0 = t;
      tile.n = n;
      tile.first = first_visible(t);
      tile.last = batch_.slot[t + n - 1];
      tile.span0 = tile.first / span_pos;
      tile.spans = tile.last / span_pos - tile.span0 + 1;
      scr_.tiles.push_back(tile);
      t += n;
    }
  }

  // Jobs: enough (tile, head) jobs keep every thread busy; otherwise every span is a job.
  void plan_jobs() {
    const int64_t n_tiles = int64_t(scr_.tiles.size());
    int64_t most_spans = 0;
    for (const Tile& tile : scr_.tiles) most_spans = std::max(most_spans, tile.spans);
    const bool split = pool_.n_threads() > 1 && most_spans > 1 && n_tiles * G_ < 4 * int64_t(pool_.n_threads());
    scr_.jobs.clear();
    int64_t n_partials = 0;
    for (int64_t i = 0; i < n_tiles; ++i) {
      Tile& tile = scr_.tiles[size_t(i)];
      tile.partial0 = n_partials;
      for (int64_t g = 0; g < G_; ++g) {
        if (!split) {
          scr_.jobs.push_back({i, g, -1});
          continue;
        }
        for (int64_t s = 0; s < tile.spans; ++s) scr_.jobs.push_back({i, g, s});
      }
      if (split) n_partials += G_ * tile.spans * tile.n * R_;
    }
    if (!split) return;
    scr_.partials.resize(size_t(n_partials) * partial_floats());
    if (scr_.spans_left_size < size_t(n_tiles * G_)) {
      scr_.spans_left_size = size_t(n_tiles * G_);
      scr_.spans_left = std::make_unique<std::atomic<int64_t>[]>(scr_.spans_left_size);
    }
    for (int64_t i = 0; i < n_tiles * G_; ++i)
      scr_.spans_left[size_t(i)].store(scr_.tiles[size_t(i / G_)].spans, std::memory_order_relaxed);
  }

  int32_t first_visible(int64_t t) const { return L_.is_swa ? std::max(0, batch_.slot[t] - L_.window + 1) : 0; }

  // The rows of one tile and KV head: their queries copied together, and each token's bounds.
  TileRows tile_rows(const Tile& tile, int64_t g, std::vector<uint8_t>& qbuf, std::vector<int32_t>& bounds) const {
    TileRows tr;
    tr.kv = &kv_;
    tr.L = &L_;
    tr.seq = (*batch_.chunks)[size_t(batch_.chunk_of[tile.t0])].seq;
    tr.kt = types_.k;
    tr.vt = types_.v;
    tr.R = R_;
    tr.n_rows = tile.n * R_;
    tr.bs = bs_;
    tr.scale = scale_;
    tr.qb = qb_;
    qbuf.resize(size_t(tr.n_rows) * qb_);
    bounds.resize(size_t(2 * tile.n));
    for (int64_t i = 0; i < tile.n; ++i) {
      const int64_t t = tile.t0 + i;
      std::memcpy(qbuf.data() + size_t(i * R_) * qb_, scr_.queries.data() + size_t(t * H_ + g * R_) * qb_,
                  size_t(R_) * qb_);
      bounds[size_t(i)] = first_visible(t);
      bounds[size_t(tile.n + i)] = batch_.slot[t];
    }
    tr.q = qbuf.data();
    tr.first = bounds.data();
    tr.last = bounds.data() + tile.n;
    return tr;
  }

  void write_out(const Tile& tile, int64_t g, const RowState* F, const float* f_acc) const {
    for (int64_t i = 0; i < tile.n; ++i)
      for (int64_t r = 0; r < R_; ++r) {
        const int64_t row = i * R_ + r;
        float* out = o_ + ((tile.t0 + i) * H_ + g * R_ + r) * Dv_;
        std::memcpy(out, f_acc + row * Dv_, size_t(Dv_) * sizeof(float));
        kernels::scale_f32(1.0f / F[row].l, out, Dv_);
      }
  }

  float* partial(const Tile& tile, int64_t g, int64_t span) const {
    const int64_t n_rows = tile.n * R_;
    return scr_.partials.data() + size_t(tile.partial0 + (g * tile.spans + span) * n_rows) * partial_floats();
  }

  // The left fold of a (tile, head)'s span partials, in position order, and the output.
  void fold_partials(const Tile& tile, int64_t g) const {
    const int64_t n_rows = tile.n * R_;
    thread_local std::vector<float> f_acc;
    thread_local std::vector<RowState> F;
    F.assign(size_t(n_rows), RowState{});
    f_acc.assign(size_t(n_rows * Dv_), 0.0f);
    for (int64_t sp = 0; sp < tile.spans; ++sp) {
      const float* part = partial(tile, g, sp);
      for (int64_t r = 0; r < n_rows; ++r, part += partial_floats())
        fold(F[size_t(r)], f_acc.data() + r * Dv_, RowState{part[0], part[1]}, part + 2, Dv_);
    }
    write_out(tile, g, F.data(), f_acc.data());
  }

  void run_job(const Job& job) const {
    const Tile& tile = scr_.tiles[size_t(job.tile)];
    thread_local std::vector<uint8_t> qbuf;
    thread_local std::vector<int32_t> bounds;
    thread_local std::vector<float> s, acc, f_acc;
    thread_local std::vector<RowState> st, F;
    const TileRows tr = tile_rows(tile, job.g, qbuf, bounds);
    s.resize(size_t(tr.n_rows * bs_));
    acc.resize(size_t(tr.n_rows * Dv_));
    st.resize(size_t(tr.n_rows));
    if (job.span >= 0) {  // one span; the fold comes after all jobs
      const int64_t sp = tile.span0 + job.span;
      run_span(tr, job.g, sp * kSpanBlocks, (sp + 1) * kSpanBlocks, st.data(), acc.data(), s.data());
      float* part = partial(tile, job.g, job.span);
      for (int64_t r = 0; r < tr.n_rows; ++r, part += partial_floats()) {
        part[0] = st[size_t(r)].m;
        part[1] = st[size_t(r)].l;
        std::memcpy(part + 2, acc.data() + r * Dv_, size_t(Dv_) * sizeof(float));
      }
      // The last span of this (tile, head) to finish folds them all (acquire: the other
      // jobs' partials are visible).
      if (scr_.spans_left[size_t(job.tile * G_ + job.g)].fetch_sub(1, std::memory_order_acq_rel) == 1)
        fold_partials(tile, job.g);
      return;
    }
    F.assign(size_t(tr.n_rows), RowState{});
    f_acc.assign(size_t(tr.n_rows * Dv_), 0.0f);
    for (int64_t sp = tile.span0; sp < tile.span0 + tile.spans; ++sp) {
      run_span(tr, job.g, sp * kSpanBlocks, (sp + 1) * kSpanBlocks, st.data(), acc.data(), s.data());
      for (int64_t r = 0; r < tr.n_rows; ++r)
        fold(F[size_t(r)], f_acc.data() + r * Dv_, st[size_t(r)], acc.data() + r * Dv_, Dv_);
    }
    write_out(tile, job.g, F.data(), f_acc.data());
  }

  const KvPool& kv_;
  const AttentionLayer& L_;
  const AttentionBatch& batch_;
  const float* q_;
  float* o_;
  ThreadPool& pool_;
  AttentionScratch& scr_;
  const KvTypes types_;
  const KvRotation rot_;
  const int64_t T_, H_, G_, R_, D_, Dv_;
  const int32_t bs_;
  const size_t qb_;
  const float scale_;
};

}  // namespace

void attend(const KvPool& kv, const AttentionLayer& L, const AttentionBatch& batch, const float* q, float* o,
            ThreadPool& pool, AttentionScratch& scr) {
  check_layer(kv, L);
  AttendCall(kv, L, batch, q, o, pool, scr).run();
}

void attend_reference(const KvPool& kv, const AttentionLayer& L, const AttentionBatch& batch, const float* q,
                      float* o) {
  check_layer(kv, L);
  const KvTypes types = kv.types();
  const KvRotation rot = kv_rotation(types, L.head_dim_k, L.head_dim_v);
  const int64_t T = batch.n_tokens, H = L.n_head, G = L.n_head_kv, R = H / G, D = L.head_dim_k, Dv = L.head_dim_v;
  const int32_t bs = kv.block_size();
  const size_t qb = kernels::attn_query_bytes(types.k, D);
  std::vector<uint8_t> qc(qb);
  std::vector<float> qr(static_cast<size_t>(D)), key(static_cast<size_t>(D)), val(static_cast<size_t>(Dv));
  std::vector<double> sc, out(static_cast<size_t>(Dv));
  for (int64_t t = 0; t < T; ++t) {
    const KvSeq& seq = *(*batch.chunks)[size_t(batch.chunk_of[t])].seq;
    const int32_t p = batch.slot[t], lo = L.is_swa ? std::max(0, p - L.window + 1) : 0;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / R;
      // The query as the key type rounds it.
      std::memcpy(qr.data(), q + (t * H + h) * D, size_t(D) * sizeof(float));
      if (rot.k) kernels::hadamard_rows(qr.data(), D, rot.k);
      kernels::attn_convert_query(types.k, qr.data(), D, qc.data());
      kernels::attn_query_values(types.k, qc.data(), D, qr.data());
      sc.assign(size_t(p - lo + 1), 0.0);
      double mx = -INFINITY;
      for (int32_t u = lo; u <= p; ++u) {
        const int32_t block = kv.block_of(seq, L.kv_layer, u);
        kernels::kv_load_key(types.k, kv.k_head(L.kv_layer, block, int32_t(g)), bs, u % bs, D, key.data());
        double s = 0;
        for (int64_t i = 0; i < D; ++i) s += double(qr[size_t(i)]) * key[size_t(i)];
        sc[size_t(u - lo)] = s / std::sqrt(double(D));
        mx = std::max(mx, sc[size_t(u - lo)]);
      }
      double sum = 0;
      std::fill(out.begin(), out.end(), 0.0);
      for (int32_t u = lo; u <= p; ++u) {
        const double w = std::exp(sc[size_t(u - lo)] - mx);
        sum += w;
        const int32_t block = kv.block_of(seq, L.kv_layer, u);
        kernels::kv_load_value(types.v, kv.v_head(L.kv_layer, block, int32_t(g)), bs, u % bs, Dv, val.data());
        for (int64_t c = 0; c < Dv; ++c) out[size_t(c)] += w * val[size_t(c)];
      }
      for (int64_t c = 0; c < Dv; ++c) o[(t * H + h) * Dv + c] = float(out[size_t(c)] / sum);
    }
    if (rot.v) kernels::hadamard_rows(o + t * H * Dv, H * Dv, rot.v);
  }
}

}  // namespace step35
