// MTP speculative decoding (docs/architecture.md, "MTP heads"): the model's own
// multi-token-prediction blocks draft up to K tokens after each verified token; the trunk
// scores the pending token plus the drafts in one batched pass; the longest agreeing
// prefix is kept plus one corrected/bonus token; rejected drafts are rolled back from
// every KV cache.
//
// Chain (architecture.md "MTP heads"): with the trunk holding positions < N and the pending
// (sampled, not yet run) token x_N, chain step 0 runs MTP block 0 at position N on (x_N, H_{N-1})
// and drafts d_{N+1}; step k runs at N+k on (d_{N+k}, m_{k-1,N+k-1}), the previous step's output,
// and drafts d_{N+k+1}. Each block keeps its own KV cache of "canonical" entries (verified tokens,
// inputs from verified states), so the blocks catch up on every position the trunk verified. A
// model with one MTP block reuses it for every step (entries written by steps >= 1 are dropped
// after verification); otherwise K is at most the number of blocks.
//
// Greedy verification reproduces non-speculative greedy decoding exactly (the trunk's
// batched pass is batch-invariant); with sampling, standard speculative rejection
// sampling keeps the output distribution equal to the target model's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/mtp_limits.h"
#include "engine/sampler.h"
#include "exec/batch.h"
#include "exec/kv_cache.h"
#include "tensor/kernels.h"

namespace step35 {

class Model;
class Sequence;
class ThreadPool;
struct Workspace;

// Hidden rows (n_embd floats each) of a contiguous range of positions.
class HiddenRows {
 public:
  void init(int32_t n_embd, int32_t capacity);
  // Stores rows of positions [first, first + n); a range that does not continue or overlap
  // the stored one replaces it. Keeps the newest `capacity` positions.
  void put(int32_t first, const float* rows, int32_t n);
  // Whether positions [p0, p1) are all available (negative positions are zero rows).
  bool has(int32_t p0, int32_t p1) const;
  // Copies positions [p0, p1) into dst.
  void get(int32_t p0, int32_t p1, float* dst) const;
  void clear() { first_ = end_ = 0, rows_.clear(); }
  int32_t first() const { return first_; }
  int32_t end() const { return end_; }

 private:
  int32_t n_embd_ = 0, capacity_ = 0;
  int32_t first_ = 0, end_ = 0;  // [first_, end_) stored
  std::vector<float> rows_;
};

// Acceptance and cost statistics of one speculating sequence (or a whole run).
struct SpeculationStats {
  uint64_t steps = 0;                  // verification passes with >= 1 draft
  uint64_t drafted[kMaxDrafts + 1] = {};   // drafts proposed at chain position 1..kMaxDrafts (index 0 unused)
  uint64_t accepted[kMaxDrafts + 1] = {};  // ... of which accepted
  uint64_t tokens = 0;                 // tokens produced by those steps (accepted + bonus)
  uint64_t plain_steps = 0;            // decode passes without drafts
  double acceptance(int k) const { return drafted[k] ? double(accepted[k]) / double(drafted[k]) : 0.0; }
  double mean_tokens_per_step() const { return steps ? double(tokens) / double(steps) : 0.0; }
  void add(const SpeculationStats& o);
};

// Per-sequence MTP state.
struct MtpState {
  std::vector<KvSeq> kv;        // per MTP block
  std::vector<int32_t> base;    // per block: position of its KV slot 0
  HiddenRows trunk;             // trunk outputs H_p
  std::vector<HiddenRows> out;  // per chain step: block outputs m_{k,p}
  bool synced = false;          // the blocks' caches are consistent with the trunk
  std::vector<int32_t> drafts;  // the current drafts d_{N+1} ...
  std::vector<std::vector<Sampler::TokenProb>> q;  // their draft distributions
  SpeculationStats stats;
};

class MtpDrafter {
 public:
  // max_k: most drafts per step (clamped to kMaxDrafts, and to the number of MTP blocks
  // unless there is exactly one). Caches are sized for max_seqs sequences of n_ctx
  // positions, in the cache types kv_types.
  MtpDrafter(const Model& model, int32_t max_k, int32_t max_seqs, int32_t n_ctx, KvTypes kv_types = {});
  ~MtpDrafter();
  int32_t max_k() const { return max_k_; }
  int32_t n_blocks() const { return n_blocks_; }

  void init(MtpState& st) const;
  void release(MtpState& st);  // frees the sequence's MTP caches

  struct Job {
    MtpState* st = nullptr;
    const int32_t* tokens = nullptr;  // tokens by position; tokens[n_pos] is the pending token
    int32_t n_pos = 0;                // N: positions the trunk holds
    int32_t k = 0;                    // drafts wanted (<= max_k)
    Sampler* sampler = nullptr;       // draws drafts from its distribution (greedy: argmax)
    RoutingPolicy routing;
    // When the blocks' caches must catch up with the trunk, how many earlier positions they
    // recompute at most (0: the default window). A short window makes an occasional probe
    // cheap; the blocks then attend to fewer earlier positions.
    int32_t catch_up_window = 0;
    // Pictures in the prompt (negative ids in `tokens`): picture_row[p] is the row of
    // position p in picture_rows (n_embd floats each), -1 at a token; null without pictures.
    // A picture position's input to the blocks is its row, as for the trunk.
    const int32_t* picture_row = nullptr;
    const float* picture_rows = nullptr;
  };
  // Fills st->drafts / st->q for every job (fewer drafts than asked if a block cannot run).
  void draft(std::vector<Job>& jobs, ThreadPool& pool, Workspace& ws, Precision precision);
  // Positions the last draft() recomputed to bring the blocks' caches up to the trunk
  // (0 when every job was in step): such a call's time is mostly catch-up, not drafting.
  int64_t catch_up_tokens() const { return catch_up_tokens_; }
  // Bytes of the MTP caches' pages in memory (KvPool::resident_bytes over the blocks).
  size_t kv_resident_bytes() const {
    size_t n = 0;
    for (const auto& p : pools_) n += p->resident_bytes();
    return n;
  }

  // After verification: the trunk went from n_pos_old to n_pos_new positions, having run
  // k_used drafts; rolls every block back to its canonical entries.
  void commit(MtpState& st, int32_t n_pos_old, int32_t n_pos_new, int32_t k_used);

  // Test instrumentation: replaces the draft of chain step k (drafting after n_pos
  // positions) before later steps see it; its draft distribution becomes a point mass.
  // Random-weight MTP blocks never agree with the trunk, so tests use this to drive the
  // accept-and-roll-back paths with drafts that are partly right.
  std::function<int32_t(int32_t n_pos, int32_t k, int32_t draft)> draft_override;

 private:
  int32_t block_of_step(int32_t k) const { return n_blocks_ == 1 ? 0 : k; }
  void sync(MtpState& st, int32_t n_pos, int32_t window);
  void start_job(Job& job, Sampler::History& saved);
  void gather_chain_step(std::vector<Job>& jobs, int32_t k);
  void take_draft(Job& job, int32_t k, size_t c);

  const Model& model_;
  int32_t max_k_ = 0, n_blocks_ = 0;
  std::vector<std::unique_ptr<KvPool>> pools_;  // one per MTP block
  BatchOutput out_;
  std::vector<SeqChunk> chunks_;
  std::vector<size_t> members_;  // the job of each chunk
  std::vector<float> h_in_;
  std::vector<std::vector<int32_t>> chunk_tokens_;
  std::vector<std::vector<float>> chunk_rows_;  // a chunk's picture rows (SeqChunk::embeddings)
  int64_t catch_up_tokens_ = 0;
};

// Decides how many drafts survive verification. rows: the trunk's logits for
// [pending, d_1 .. d_K] (K + 1 rows). Greedy: a draft survives while it equals the argmax;
// sampling: accepted with probability min(1, p(d)/q(d)), else the replacement is drawn
// from max(0, p - q). synthetic_accept in [0, 1] (benchmarks only) accepts each draft with
// that probability instead. Appends the accepted drafts and the bonus/corrected token to
// `out`, and feeds them to the sampler's history. Returns the number of drafts accepted.
int32_t verify_drafts(Sampler& sampler, const float* rows, size_t n_vocab, const std::vector<int32_t>& drafts,
                      const std::vector<std::vector<Sampler::TokenProb>>& q, double synthetic_accept,
                      std::vector<int32_t>& out);

// Chooses K per step (0 .. max_k) from the running acceptance rates and the pass costs it
// measures at run time, so that speculation is used only when it pays: the expected
// tokens per second of K drafts is
//   E_K / (verify cost of a (K+1)-token trunk pass + K x draft cost),
//   E_K = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_K   (a_i: acceptance of draft i given i-1 accepted).
// Costs are learned, never assumed, because they change with the kernels and the machine:
// plain steps measure c_0; steps with K drafts measure c_K; an unmeasured c_K is
// extrapolated linearly from c_0 and the largest measured K (c_0 (1 + K) before any), and
// the model is kept monotone in K. The draft cost is learned from steps whose MTP caches
// were in step with the trunk, so catch-up work after a pause does not inflate it; until
// such a step exists, a step with catch-up gives an estimate with its time shared evenly
// over the positions it ran (optimistic, as catch-up positions skip the vocabulary
// projection, so a wrong guess leads to a measured step rather than to never trying).
// When K = 0 is best the controller probes speculation now and then (K = 1 by default) to
// notice a change in acceptance; a probe that does not pay doubles the wait before the next
// one (kFirstProbeGap, 2x, ... up to kMaxProbeGap steps), a paying probe resets it. A probe
// catches the MTP caches up over only kProbeCatchUp positions: recomputing more costs more
// than the probe itself (each position is a pass through the MTP block). Probes are also
// held to a budget: what they cost beyond plain decoding of the tokens they produced (as
// measured, catch-up included) stays within kProbeBudget of the decode time so far, so
// that turning MTP on costs at most that much when drafts are never accepted.
class AdaptiveK {
 public:
  static constexpr uint64_t kFirstProbeStep = 32;  // plain steps before the first probe
  static constexpr uint64_t kFirstProbeGap = 32;
  static constexpr uint64_t kMaxProbeGap = 1024;
  // MTP-cache catch-up window for a probe (MtpDrafter::Job::catch_up_window): a probe after
  // a long pause would otherwise recompute the default window of positions in the blocks.
  static constexpr int32_t kProbeCatchUp = 4;
  static constexpr double kProbeBudget = 0.02;

  explicit AdaptiveK(int32_t max_k);
  int32_t choose();  // K for the next step
  // Records one step: k drafts were run, `accepted` of them accepted; seconds spent in the
  // trunk pass and in drafting; positions the drafting recomputed to catch the MTP caches
  // up (MtpDrafter::catch_up_tokens()).
  void record(int32_t k, int32_t accepted, double trunk_s, double draft_s, int64_t catch_up = 0) {
    record_acceptance(k, accepted);
    record_cost(k, trunk_s, draft_s, catch_up);
  }
  // The same in two parts, for a batch of sequences sharing one pass: the acceptance of
  // each sequence, and the pass costs once.
  void record_acceptance(int32_t k, int32_t accepted);
  void record_cost(int32_t k, double trunk_s, double draft_s, int64_t catch_up = 0);

  // The learned model.
  double acceptance(int32_t pos) const;        // a_pos estimate, pos 1..kMaxDrafts
  double verify_cost(int32_t k) const;         // seconds per trunk pass of k+1 tokens (estimate, monotone)
  bool verify_measured(int32_t k) const { return trunk_n_[size_t(k)] > 0; }
  double draft_cost() const;                   // seconds per draft (estimate)
  double expected_tokens(int32_t k) const;     // E_k
  double rate(int32_t k) const;                // tokens per second with k drafts (estimate)
  int32_t best_k() const;                      // argmax of rate() (0 while c_0 is unknown)
  int32_t last_choice() const { return last_; }
  bool last_was_probe() const { return last_probe_; }
  uint64_t probes() const { return probes_; }
  uint64_t paying_probes() const { return paying_probes_; }
  uint64_t probe_gap() const { return probe_gap_; }
  uint64_t steps() const { return step_; }
  double probe_overhead_s() const { return probe_overhead_s_; }  // probes' cost beyond plain decoding
  double elapsed_s() const { return elapsed_s_; }                // all recorded pass time

 private:
  int32_t max_k_;
  // Acceptance of draft position i: exponentially decayed hit and trial counts.
  double hits_[kMaxDrafts + 1] = {}, trials_[kMaxDrafts + 1] = {};
  double trunk_[kMaxDrafts + 1] = {};      // seconds per (k+1)-token trunk pass, running mean
  uint64_t trunk_n_[kMaxDrafts + 1] = {};  // samples behind trunk_
  double draft_ = 0;             // seconds per draft step, running mean (in-step drafting only)
  uint64_t draft_n_ = 0;
  double draft_rough_ = 0;       // per draft from steps with catch-up (used only while draft_ is unknown)
  uint64_t draft_rough_n_ = 0;
  uint64_t step_ = 0, next_probe_ = kFirstProbeStep, probe_gap_ = kFirstProbeGap;
  uint64_t probes_ = 0, paying_probes_ = 0;
  double elapsed_s_ = 0, probe_overhead_s_ = 0, last_probe_overhead_s_ = -1;
  int32_t last_ = 0;
  bool last_probe_ = false, probe_pending_ = false;
  int32_t probe_accepted_ = 0;
};

// MTP speculation for the sequences of one KV pool: the drafter (with the MTP blocks'
// own caches) and how many drafts each step gets, a fixed K or AdaptiveK's choice. The
// sequences verify and roll back themselves (Sequence::consume).
class Speculation {
 public:
  // max_k: drafts per step at most (the drafter clamps it to the model); adaptive: K per
  // step from AdaptiveK, else always max_k. MTP caches for max_seqs sequences of n_ctx
  // positions, in the cache types kv_types (those of the trunk's pool).
  Speculation(const Model& model, int32_t max_k, bool adaptive, int32_t max_seqs, int32_t n_ctx,
              KvTypes kv_types = {});
  int32_t max_k() const { return drafter_.max_k(); }
  bool adaptive() const { return adaptive_; }
  size_t kv_resident_bytes() const { return drafter_.kv_resident_bytes(); }
  // Forgets what the controller learned (a new sequence in the same memory); the MTP
  // caches stay allocated, so benchmark repetitions do not time pages being faulted in.
  void reset() { adaptive_k_ = AdaptiveK(drafter_.max_k()); }

  // Drafts the next step's tokens for every sequence in `seqs` that wants them, with one K
  // chosen for the step when any of them is decoding. Drafting is an optimisation: when it
  // fails (e.g. no MTP cache memory) those sequences run plainly.
  void draft(const std::vector<Sequence*>& seqs, ThreadPool& pool, Workspace& ws, Precision precision);
  // A verification's outcome (Sequence::consume): k drafts run, `accepted` of them kept.
  void record_acceptance(int32_t k, int32_t accepted) { adaptive_k_.record_acceptance(k, accepted); }
  // After a forward pass without prompt tokens whose chunks carried at most k drafts: the
  // pass's trunk time, with the drafting that prepared it, goes to the cost model.
  void record_pass(int32_t k, double trunk_s);

  MtpDrafter& drafter() { return drafter_; }
  const AdaptiveK& controller() const { return adaptive_k_; }

 private:
  MtpDrafter drafter_;
  AdaptiveK adaptive_k_;
  bool adaptive_;
  std::vector<MtpDrafter::Job> jobs_;
  double last_draft_s_ = 0;     // the last draft()'s time
  int64_t last_catch_up_ = 0;   // positions it recomputed to catch the MTP caches up
};

}  // namespace step35
