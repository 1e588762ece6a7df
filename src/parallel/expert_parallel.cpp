#include "parallel/expert_parallel.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/step35.h"
#include "model/workspace.h"
#include "exec/thread_pool.h"

#ifdef STEP35_HAVE_MPI
#include <mpi.h>
#endif

namespace step35 {

#ifndef STEP35_HAVE_MPI

bool mpi_built() { return false; }
std::unique_ptr<ExpertParallel> ExpertParallel::start() {
  throw std::runtime_error("built without MPI (install libopenmpi-dev and rebuild for --ep)");
}
ExpertParallel::~ExpertParallel() = default;
std::unique_ptr<ExpertExecutor> ExpertParallel::executor(const Model&, ExpertPlacement) { return nullptr; }
void ExpertParallel::follow(Model&, ThreadPool&) {}
void ExpertParallel::abort_all(int code) { std::exit(code); }

#else

bool mpi_built() { return true; }

namespace {

// Message tags: rank 0 -> follower work / shutdown / replaced experts, follower -> rank 0
// down rows.
constexpr int kTagWork = 1, kTagShutdown = 2, kTagRows = 3, kTagWeights = 4;

// A weights message: the replaced expert matrices of a WeightSet (model patches), each as
// u32 name length, name, i32 expert, u32 type, u64 byte count, bytes. Only 3-D expert
// tensors: the followers compute nothing else.
std::vector<uint8_t> encode_expert_replacements(const WeightSet& ws) {
  std::vector<uint8_t> out;
  auto put = [&](const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  for (const MatrixReplacement& r : ws.replacements) {
    if (r.expert < 0) continue;
    const uint32_t len = uint32_t(r.tensor.size()), type = uint32_t(r.type);
    const int32_t expert = r.expert;
    const uint64_t n = r.n_bytes;
    put(&len, 4);
    put(r.tensor.data(), len);
    put(&expert, 4);
    put(&type, 4);
    put(&n, 8);
    put(r.data, r.n_bytes);
  }
  return out;
}

std::vector<MatrixReplacement> decode_expert_replacements(std::shared_ptr<const std::vector<uint8_t>> msg) {
  std::vector<MatrixReplacement> out;
  const std::vector<uint8_t>& m = *msg;
  size_t at = 0;
  auto get = [&](void* p, size_t n) {
    if (n > m.size() - at) throw std::runtime_error("expert parallelism: malformed weights message");
    std::memcpy(p, m.data() + at, n);
    at += n;
  };
  while (at < m.size()) {
    MatrixReplacement r;
    uint32_t len = 0, type = 0;
    uint64_t n = 0;
    get(&len, 4);
    if (len > 256) throw std::runtime_error("expert parallelism: malformed weights message");
    r.tensor.resize(len);
    get(r.tensor.data(), len);
    get(&r.expert, 4);
    get(&type, 4);
    get(&n, 8);
    if (n > m.size() - at) throw std::runtime_error("expert parallelism: malformed weights message");
    r.type = DType(type);
    r.data = m.data() + at;
    r.n_bytes = size_t(n);
    r.owner = msg;
    at += size_t(n);
    out.push_back(std::move(r));
  }
  return out;
}

// A work message: this header, then n_groups (expert, n_rows) int32 pairs, then n_pairs
// int32 indices into the packed activation rows, padded to 8 bytes, then n_packed rows
// of act_stride bytes. The reply is n_pairs rows of n_embd floats, group by group.
struct WorkHeader {
  int64_t layer, n_packed, act_type, act_stride, precision, n_groups, n_pairs;
};

size_t padded(size_t n) { return (n + 7) / 8 * 8; }

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string("MPI error in ") + what);
}

// Per-rank scratch of the executor on rank 0.
struct RankWork {
  std::vector<int32_t> groups, pair_rows;  // as in the message
  std::vector<int32_t> packed_of;          // batch row -> packed row (-1: not sent)
  std::vector<int32_t> packed_src;         // packed row -> batch row
  std::vector<uint8_t> msg;
  std::vector<float> rows;                 // reply
  MPI_Request request = MPI_REQUEST_NULL;
};

class MpiExpertExecutor final : public ExpertExecutor {
 public:
  MpiExpertExecutor(const Model& m, ExpertPlacement p, int n_ranks)
      : m_(m), placement_(std::move(p)), work_(size_t(n_ranks)) {}
  // A forward pass that failed between begin() and finish() leaves replies on the way:
  // take them, so the followers are back in their receive for the shutdown message.
  ~MpiExpertExecutor() override { drain(); }

  bool is_local(int il, int32_t e) const override { return placement_.owner(il, e) == 0; }

  void sync_weights(const WeightSet& ws) override {
    if (ws.version == synced_version_) return;
    drain();
    // Every follower gets all replaced experts (each computes only its own); the
    // message goes before this pass's first work message, and MPI keeps their order.
    const std::vector<uint8_t> msg = encode_expert_replacements(ws);
    if (msg.size() > size_t(INT32_MAX)) throw std::runtime_error("expert parallelism: replaced experts exceed 2 GiB");
    for (size_t r = 1; r < work_.size(); ++r)
      check(MPI_Send(msg.data(), int(msg.size()), MPI_BYTE, int(r), kTagWeights, MPI_COMM_WORLD), "MPI_Send");
    synced_version_ = ws.version;
  }

  void begin(int il, const kernels::ActRows& acts, const std::vector<std::vector<int32_t>>& expert_tokens,
             Precision precision) override {
    drain();  // (replies of an earlier block whose forward pass failed before finish())
    const int64_t X = m_.hparams().n_expert;
    for (size_t r = 1; r < work_.size(); ++r) {
      RankWork& w = work_[r];
      w.groups.clear();
      w.pair_rows.clear();
      w.packed_src.clear();
      w.packed_of.assign(size_t(acts.n_tok), -1);
      for (int64_t e = 0; e < X; ++e) {
        const auto& toks = expert_tokens[size_t(e)];
        if (toks.empty() || placement_.owner(il, int32_t(e)) != int32_t(r)) continue;
        w.groups.push_back(int32_t(e));
        w.groups.push_back(int32_t(toks.size()));
        for (int32_t t : toks) {
          int32_t& p = w.packed_of[size_t(t)];
          if (p < 0) {
            p = int32_t(w.packed_src.size());
            w.packed_src.push_back(t);
          }
          w.pair_rows.push_back(p);
        }
      }
      if (w.groups.empty()) continue;
      WorkHeader h{il, int64_t(w.packed_src.size()), int64_t(acts.type), int64_t(acts.stride), int64_t(precision),
                   int64_t(w.groups.size() / 2), int64_t(w.pair_rows.size())};
      const size_t ints = (w.groups.size() + w.pair_rows.size()) * sizeof(int32_t);
      const size_t bytes = sizeof h + padded(ints) + w.packed_src.size() * acts.stride;
      if (bytes > size_t(INT32_MAX)) throw std::runtime_error("expert parallelism: a batch's message exceeds 2 GiB; use a smaller batch");
      w.msg.assign(bytes, 0);
      uint8_t* q = w.msg.data();
      std::memcpy(q, &h, sizeof h);
      q += sizeof h;
      std::memcpy(q, w.groups.data(), w.groups.size() * sizeof(int32_t));
      std::memcpy(q + w.groups.size() * sizeof(int32_t), w.pair_rows.data(), w.pair_rows.size() * sizeof(int32_t));
      q += padded(ints);
      for (size_t i = 0; i < w.packed_src.size(); ++i) {
        const size_t src = size_t(acts.idx ? acts.idx[w.packed_src[i]] : w.packed_src[i]);
        std::memcpy(q + i * acts.stride, acts.data + src * acts.stride, acts.stride);
      }
      // A blocking send: the follower waits in its receive, so this returns as soon as
      // the data is across, and the follower computes while rank 0 goes on.
      check(MPI_Send(w.msg.data(), int(bytes), MPI_BYTE, int(r), kTagWork, MPI_COMM_WORLD), "MPI_Send");
      const size_t n_floats = w.pair_rows.size() * size_t(m_.hparams().n_embd);
      if (n_floats > size_t(INT32_MAX)) throw std::runtime_error("expert parallelism: reply exceeds 2^31 floats");
      w.rows.resize(n_floats);
      check(MPI_Irecv(w.rows.data(), int(n_floats), MPI_FLOAT, int(r), kTagRows, MPI_COMM_WORLD, &w.request), "MPI_Irecv");
    }
  }

  void finish(int, const std::vector<std::vector<int32_t>>& expert_tokens, const int64_t* first_row,
              float* down) override {
    const size_t E = size_t(m_.hparams().n_embd);
    for (size_t r = 1; r < work_.size(); ++r) {
      RankWork& w = work_[r];
      if (w.request == MPI_REQUEST_NULL) continue;
      check(MPI_Wait(&w.request, MPI_STATUS_IGNORE), "MPI_Wait");
      const float* src = w.rows.data();
      for (size_t g = 0; g < w.groups.size(); g += 2) {
        const int32_t e = w.groups[g];
        const size_t n = expert_tokens[size_t(e)].size();
        std::memcpy(down + size_t(first_row[e]) * E, src, n * E * sizeof(float));
        src += n * E;
      }
    }
  }

 private:
  void drain() {
    for (RankWork& w : work_)
      if (w.request != MPI_REQUEST_NULL) MPI_Wait(&w.request, MPI_STATUS_IGNORE);
  }

  const Model& m_;
  ExpertPlacement placement_;
  std::vector<RankWork> work_;
  uint64_t synced_version_ = 0;  // the followers start with the file's weights
};

// A work message checked against this rank's model, with pointers into its parts.
struct FollowerWork {
  WorkHeader h{};
  const int32_t* groups = nullptr;     // n_groups (expert, n_rows) pairs
  const int32_t* pair_rows = nullptr;  // n_pairs indices into the packed rows
  const uint8_t* act_in = nullptr;     // n_packed rows of act_stride bytes
  const LayerHParams* L = nullptr;
  std::shared_ptr<const WeightSet> weights;  // with replaced experts
  const LayerWeights* W = nullptr;
  int64_t E = 0, F = 0;
  Precision prec{};
  int64_t n_rows = 0;
};

FollowerWork read_work_message(const Model& m, const std::vector<uint8_t>& msg) {
  FollowerWork w;
  WorkHeader& h = w.h;
  if (msg.size() < sizeof h) throw std::runtime_error("expert parallelism: short work message");
  std::memcpy(&h, msg.data(), sizeof h);
  const HParams& hp = m.hparams();
  if (h.layer < 0 || h.layer >= int64_t(hp.layers.size()) || !hp.layers[size_t(h.layer)].is_moe)
    throw std::runtime_error("expert parallelism: work for a block that is not MoE");
  w.L = &hp.layers[size_t(h.layer)];
  w.weights = m.weights();
  w.W = &w.weights->layers[size_t(h.layer)];
  w.E = hp.n_embd;
  w.F = w.L->n_ff_exp;
  const size_t ints = size_t(2 * h.n_groups + h.n_pairs) * sizeof(int32_t);
  if (msg.size() != sizeof h + padded(ints) + size_t(h.n_packed * h.act_stride))
    throw std::runtime_error("expert parallelism: work message of the wrong size");
  w.groups = reinterpret_cast<const int32_t*>(msg.data() + sizeof h);
  w.pair_rows = w.groups + 2 * h.n_groups;
  w.act_in = msg.data() + sizeof h + padded(ints);
  w.prec = Precision(h.precision);
  w.n_rows = h.n_pairs;
  return w;
}

// The experts of the message's groups into ws.routed_experts, each group checked.
void collect_routed_experts(const FollowerWork& w, int64_t n_expert, Workspace& ws) {
  int64_t row = 0;
  ws.routed_experts.clear();
  for (int64_t g = 0; g < w.h.n_groups; ++g) {
    const int32_t e = w.groups[2 * g], n = w.groups[2 * g + 1];
    if (e < 0 || e >= n_expert || n <= 0 || row + n > w.n_rows)
      throw std::runtime_error("expert parallelism: malformed work message");
    ws.routed_experts.push_back(e);
    row += n;
  }
}

// Gate products into gu's first n_rows rows, up products into the next n_rows.
void gate_up_products(const FollowerWork& w, float* gu, Workspace& ws, ThreadPool& pool) {
  const int64_t F = w.F, n_rows = w.n_rows;
  int64_t row = 0;
  for (int64_t g = 0; g < w.h.n_groups; ++g) {
    const int32_t e = w.groups[2 * g], n = w.groups[2 * g + 1];
    MatJob j;
    j.x.type = kernels::ActType(w.h.act_type);
    j.x.data = w.act_in;
    j.x.stride = size_t(w.h.act_stride);
    j.x.idx = w.pair_rows + row;
    j.x.n_tok = n;
    j.ldy = F;
    j.w = w.W->ffn_gate_exps.matrix(e);
    j.y = gu + row * F;
    ws.jobs.push_back(j);
    j.w = w.W->ffn_up_exps.matrix(e);
    j.y = gu + (n_rows + row) * F;
    ws.jobs.push_back(j);
    row += n;
  }
  if (row != n_rows) throw std::runtime_error("expert parallelism: malformed work message");
  for (int64_t i = 0; i < n_rows; ++i)
    if (w.pair_rows[i] < 0 || w.pair_rows[i] >= w.h.n_packed)
      throw std::runtime_error("expert parallelism: malformed work message");
  if (kernels::act_type(w.W->ffn_gate_exps.type, w.prec) != kernels::ActType(w.h.act_type))
    throw std::runtime_error("expert parallelism: activation format does not match this rank's model file");
  run_matmuls(ws.jobs, pool);
}

// The down projections' input: SwiGLU of the gate/up rows in their activation format.
struct DownActs {
  kernels::ActType type;
  size_t stride;
  uint8_t* rows;
};

DownActs swiglu_down_acts(const FollowerWork& w, const float* gu, Workspace& ws, ThreadPool& pool) {
  const int64_t F = w.F, n_rows = w.n_rows;
  const kernels::ActType at = kernels::act_type(w.W->ffn_down_exps.type, w.prec);
  const size_t stride = kernels::act_row_bytes(at, F);
  uint8_t* act = ws.down_act.get(stride * size_t(std::max<int64_t>(n_rows, 1)));
  auto swiglu = [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r)
      kernels::swiglu_convert(at, gu + r * F, gu + (n_rows + r) * F, F, w.L->clamp_exp, 1, F,
                              act + size_t(r) * stride);
  };
  if (n_rows < 32 || pool.n_threads() == 1)
    swiglu(0, n_rows, 0);
  else
    pool.parallel_for(n_rows, swiglu);
  return {at, stride, act};
}

// Down products into `rows` (the reply), group by group.
void down_products(const FollowerWork& w, const DownActs& act, std::vector<float>& rows, Workspace& ws,
                   ThreadPool& pool) {
  const int64_t E = w.E;
  rows.resize(size_t(std::max<int64_t>(w.n_rows, 1) * E));
  ws.jobs.clear();
  int64_t row = 0;
  for (int64_t g = 0; g < w.h.n_groups; ++g) {
    const int32_t e = w.groups[2 * g], n = w.groups[2 * g + 1];
    MatJob j;
    j.x.type = act.type;
    j.x.data = act.rows + size_t(row) * act.stride;
    j.x.stride = act.stride;
    j.x.n_tok = n;
    j.w = w.W->ffn_down_exps.matrix(e);
    j.y = rows.data() + row * E;
    j.ldy = E;
    ws.jobs.push_back(j);
    row += n;
  }
  run_matmuls(ws.jobs, pool);
}

// One work message on a follower: gate/up products, SwiGLU into the down projections'
// activation format, down products; the same kernels and order of operations per row as
// ForwardPass::moe_ffn, so every row is bitwise what rank 0 would have computed.
void compute_work(const Model& m, const std::vector<uint8_t>& msg, std::vector<float>& rows, Workspace& ws,
                  ThreadPool& pool) {
  const FollowerWork w = read_work_message(m, msg);
  float* gu = ws.gu.get(size_t(2 * std::max<int64_t>(w.n_rows, 1) * w.F));
  ws.jobs.clear();
  collect_routed_experts(w, m.hparams().n_expert, ws);
  // Experts repacked on first use: this rank's copies of the ones it computes now; under a
  // memory budget, read into this rank's expert cache and kept there to the end.
  const offload::ExpertCache::Lease in_memory = m.prepare_experts(int(w.h.layer), ws.routed_experts.data(), int64_t(ws.routed_experts.size()), pool);
  gate_up_products(w, gu, ws, pool);
  const DownActs act = swiglu_down_acts(w, gu, ws, pool);
  down_products(w, act, rows, ws, pool);
}

}  // namespace

std::unique_ptr<ExpertParallel> ExpertParallel::start() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    // Rank 0 may call MPI from whichever thread runs the forward pass, one at a time.
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      throw std::runtime_error("this MPI library does not support MPI_THREAD_SERIALIZED");
    }
  }
  std::unique_ptr<ExpertParallel> ep(new ExpertParallel());
  MPI_Comm_rank(MPI_COMM_WORLD, &ep->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &ep->n_ranks_);
  return ep;
}

ExpertParallel::~ExpertParallel() {
  if (rank_ == 0)
    for (int r = 1; r < n_ranks_; ++r) MPI_Send(nullptr, 0, MPI_BYTE, r, kTagShutdown, MPI_COMM_WORLD);
  MPI_Finalize();
}

void ExpertParallel::abort_all(int code) { MPI_Abort(MPI_COMM_WORLD, code); std::exit(code); }

std::unique_ptr<ExpertExecutor> ExpertParallel::executor(const Model& model, ExpertPlacement placement) {
  if (placement.n_ranks() != n_ranks_)
    throw std::invalid_argument("the expert placement is for " + std::to_string(placement.n_ranks()) +
                                " ranks, this job has " + std::to_string(n_ranks_));
  if (placement.n_expert() != model.hparams().n_expert)
    throw std::invalid_argument("the expert placement is for " + std::to_string(placement.n_expert()) +
                                " experts, the model has " + std::to_string(model.hparams().n_expert));
  return std::make_unique<MpiExpertExecutor>(model, std::move(placement), n_ranks_);
}

void ExpertParallel::follow(Model& model, ThreadPool& pool) {
  Workspace ws;
  std::vector<uint8_t> msg;
  std::vector<float> rows;
  try {
    for (;;) {
      MPI_Status st;
      check(MPI_Probe(0, MPI_ANY_TAG, MPI_COMM_WORLD, &st), "MPI_Probe");
      int n = 0;
      MPI_Get_count(&st, MPI_BYTE, &n);
      msg.resize(size_t(n));
      check(MPI_Recv(msg.data(), n, MPI_BYTE, 0, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
      if (st.MPI_TAG == kTagShutdown) return;
      if (st.MPI_TAG == kTagWeights) {
        model.set_replacements(decode_expert_replacements(std::make_shared<const std::vector<uint8_t>>(msg)));
        continue;
      }
      if (st.MPI_TAG != kTagWork) throw std::runtime_error("expert parallelism: unexpected message");
      compute_work(model, msg, rows, ws, pool);
      WorkHeader h;
      std::memcpy(&h, msg.data(), sizeof h);
      check(MPI_Send(rows.data(), int(h.n_pairs * model.hparams().n_embd), MPI_FLOAT, 0, kTagRows, MPI_COMM_WORLD),
            "MPI_Send");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step35 rank %d: error: %s\n", rank_, e.what());
    abort_all(1);
  }
}

#endif

}  // namespace step35
