#include "engine/speculative.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "engine/sequence.h"
#include "exec/clock.h"
#include "exec/thread_pool.h"
#include "model/step35.h"
#include "model/workspace.h"

namespace step35 {

namespace {

// How far back MTP blocks (re)start catching up when their caches are out of step with
// the trunk (first draft after a prompt, after a pause in speculation, or after a
// prefix-cache hit): the blocks then attend to at most this many earlier positions.
constexpr int32_t kSyncWindow = 128;
constexpr int32_t kTrunkRows = 256;  // trunk hidden rows kept per sequence
constexpr int32_t kOutRows = 256;    // block output rows kept per chain step

}  // namespace

// ---------------------------------------------------------------------------------------

void HiddenRows::init(int32_t n_embd, int32_t capacity) {
  n_embd_ = n_embd;
  capacity_ = capacity;
  clear();
}

// Rows live in a ring of `capacity` slots (position p in slot p % capacity), so adding a
// decode step's row costs one row copy however many are kept.
void HiddenRows::put(int32_t first, const float* rows, int32_t n) {
  if (n <= 0) return;
  const size_t E = size_t(n_embd_);
  if (rows_.empty()) rows_.resize(size_t(capacity_) * E);
  if (first > end_ || first < first_ || first_ == end_) first_ = end_ = first;
  // Only the newest `capacity` of the new rows can be kept.
  if (n > capacity_) {
    rows += size_t(n - capacity_) * E;
    first += n - capacity_;
    n = capacity_;
    first_ = first;
  }
  for (int32_t i = 0; i < n; ++i)
    std::memcpy(rows_.data() + size_t((first + i) % capacity_) * E, rows + size_t(i) * E, E * sizeof(float));
  end_ = first + n;
  first_ = std::max(first_, end_ - capacity_);
}

bool HiddenRows::has(int32_t p0, int32_t p1) const {
  if (p1 <= 0) return true;
  return std::max(p0, 0) >= first_ && p1 <= end_;
}

void HiddenRows::get(int32_t p0, int32_t p1, float* dst) const {
  const size_t E = size_t(n_embd_);
  for (int32_t p = p0; p < p1; ++p, dst += E) {
    if (p < 0)
      std::fill(dst, dst + E, 0.0f);
    else
      std::memcpy(dst, rows_.data() + size_t(p % capacity_) * E, E * sizeof(float));
  }
}

void SpeculationStats::add(const SpeculationStats& o) {
  steps += o.steps;
  tokens += o.tokens;
  plain_steps += o.plain_steps;
  for (int k = 0; k <= kMaxDrafts; ++k) drafted[k] += o.drafted[k], accepted[k] += o.accepted[k];
}

// ---------------------------------------------------------------------------------------

MtpDrafter::MtpDrafter(const Model& model, int32_t max_k, int32_t max_seqs, int32_t n_ctx, KvTypes kv_types)
    : model_(model) {
  n_blocks_ = model.n_mtp_loaded();
  max_k_ = n_blocks_ == 0 ? 0 : std::clamp(max_k, 0, kMaxDrafts);
  if (n_blocks_ > 1) max_k_ = std::min(max_k_, n_blocks_);
  const int32_t window = model.hparams().swa_window;
  for (int32_t b = 0; b < n_blocks_; ++b) {
    const std::vector<KvLayerShape> layers = {model.mtp_kv_layer(b)};
    // One pass covers at most the catch-up window plus the drafts.
    const auto per_seq = KvPool::blocks_for_sequence(layers, n_ctx, window, kSyncWindow + kMaxDrafts + 1,
                                                     KvPool::kDefaultBlockSize, kMaxDrafts);
    pools_.push_back(std::make_unique<KvPool>(layers, window, KvPool::kDefaultBlockSize,
                                              per_seq.first * std::max(1, max_seqs),
                                              per_seq.second * std::max(1, max_seqs), kMaxDrafts, kv_types));
  }
}

MtpDrafter::~MtpDrafter() = default;

void MtpDrafter::init(MtpState& st) const {
  const int32_t E = model_.hparams().n_embd;
  st.kv.assign(size_t(n_blocks_), KvSeq{});
  st.base.assign(size_t(n_blocks_), 0);
  st.trunk.init(E, kTrunkRows);
  st.out.assign(size_t(std::max(max_k_, 1)), HiddenRows{});
  for (auto& o : st.out) o.init(E, kOutRows);
  st.synced = false;
  st.drafts.clear();
  st.q.clear();
}

void MtpDrafter::release(MtpState& st) {
  for (size_t b = 0; b < st.kv.size() && b < pools_.size(); ++b) pools_[b]->free_seq(st.kv[b]);
  st.synced = false;
}

// Restarts every block's cache so that chain step k begins at position r + k, the
// earliest r for which the trunk's hidden rows are still at hand (at most kSyncWindow
// back).
void MtpDrafter::sync(MtpState& st, int32_t n_pos, int32_t window) {
  release(st);
  int32_t r = std::max(n_pos - std::clamp(window, 1, kSyncWindow), st.trunk.first() == 0 ? 0 : st.trunk.first() + 1);
  if (!st.trunk.has(r - 1, n_pos)) r = n_pos;  // only the last row (always kept)
  for (int32_t b = 0; b < n_blocks_; ++b) st.base[size_t(b)] = n_blocks_ == 1 ? r : r + b;
  st.synced = st.trunk.has(r - 1, n_pos);
}

void MtpDrafter::draft(std::vector<Job>& jobs, ThreadPool& pool, Workspace& ws, Precision precision) {
  std::vector<Sampler::History> saved(jobs.size());
  catch_up_tokens_ = 0;
  for (size_t j = 0; j < jobs.size(); ++j) start_job(jobs[j], saved[j]);
  ForwardOptions opts;
  opts.precision = precision;
  for (int32_t k = 0; k < max_k_; ++k) {
    const int32_t b = block_of_step(k);
    gather_chain_step(jobs, k);
    if (chunks_.empty()) break;
    model_.forward_mtp(b, *pools_[size_t(b)], chunks_, h_in_.data(), out_, ws, pool, opts);
    for (size_t c = 0; c < chunks_.size(); ++c) take_draft(jobs[members_[c]], k, c);
  }
  for (size_t j = 0; j < jobs.size(); ++j)
    if (jobs[j].sampler && jobs[j].k > 0) jobs[j].sampler->restore_history(saved[j]);
}

// Clamps a job's K, brings its blocks' caches in step with the trunk when they are not, and
// saves its sampler's penalty history (drafts enter it only while drafting).
void MtpDrafter::start_job(Job& job, Sampler::History& saved) {
  MtpState& st = *job.st;
  st.drafts.clear();
  st.q.clear();
  job.k = std::clamp(job.k, 0, max_k_);
  if (job.k == 0) return;
  // Blocks that fell further behind than the catch-up window (speculation paused) start
  // again from the window instead of recomputing everything since they stopped.
  const int32_t window = job.catch_up_window > 0 ? std::min(job.catch_up_window, kSyncWindow) : kSyncWindow;
  const int32_t f0 = st.base[0] + st.kv[0].n_pos;
  if (!st.synced || f0 > job.n_pos || job.n_pos - f0 > window || !st.trunk.has(f0 - 1, job.n_pos))
    sync(st, job.n_pos, window);
  if (!st.synced) job.k = 0;
  if (job.sampler) saved = job.sampler->save_history();
}

// The chunks of chain step k (chunks_, their jobs in members_, their input hidden rows in
// h_in_): every job still drafting runs the positions its block has not seen yet, up to
// N + k, on the tokens (verified, then its drafts so far) and the previous step's rows.
void MtpDrafter::gather_chain_step(std::vector<Job>& jobs, int32_t k) {
  const size_t E = size_t(model_.hparams().n_embd);
  const int32_t b = block_of_step(k);
  chunks_.clear();
  members_.clear();
  h_in_.clear();
  if (chunk_tokens_.size() < jobs.size()) chunk_tokens_.resize(jobs.size());
  if (chunk_rows_.size() < jobs.size()) chunk_rows_.resize(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    Job& job = jobs[j];
    MtpState& st = *job.st;
    if (job.k <= k || int32_t(st.drafts.size()) != k) continue;
    const int32_t N = job.n_pos, last = N + k;
    const int32_t f = st.base[size_t(b)] + st.kv[size_t(b)].n_pos;
    const HiddenRows& source = k == 0 ? st.trunk : st.out[size_t(k - 1)];
    if (f > last || !source.has(f - 1, last)) {
      st.synced = false;  // out of step: restart next time
      continue;
    }
    auto& toks = chunk_tokens_[j];
    toks.clear();
    for (int32_t p = f; p <= last; ++p) toks.push_back(p <= N ? job.tokens[p] : st.drafts[size_t(p - N - 1)]);
    const size_t at = h_in_.size();
    h_in_.resize(at + toks.size() * E);
    source.get(f - 1, last, h_in_.data() + at);
    SeqChunk c;
    c.seq = &st.kv[size_t(b)];
    c.tokens = toks.data();
    c.n_tokens = int32_t(toks.size());
    if (job.picture_row && std::any_of(toks.begin(), toks.end(), [](int32_t t) { return t < 0; })) {
      auto& rows = chunk_rows_[j];
      rows.assign(toks.size() * E, 0.0f);
      for (size_t i = 0; i < toks.size(); ++i) {
        if (toks[i] >= 0) continue;
        const int32_t row = job.picture_row[size_t(f) + i];
        std::copy_n(job.picture_rows + size_t(row) * E, E, rows.data() + i * E);
        toks[i] = -1;  // the forward pass's "take the given row"
      }
      c.embeddings = rows.data();
    }
    c.logits = LogitRows::Last;
    c.want_hidden = true;
    c.routing = job.routing;
    c.pos_offset = st.base[size_t(b)];
    catch_up_tokens_ += c.n_tokens - 1;  // in step, each chain step runs one new position
    chunks_.push_back(c);
    members_.push_back(j);
  }
}

// Chunk c of chain step k ran: keeps the block's output rows and draws the draft from its
// logits (the job's sampling distribution, or argmax without a sampler).
void MtpDrafter::take_draft(Job& job, int32_t k, size_t c) {
  const size_t E = size_t(model_.hparams().n_embd), V = size_t(model_.hparams().n_vocab);
  MtpState& st = *job.st;
  const int32_t b = block_of_step(k);
  const int32_t first = job.n_pos + k - chunks_[c].n_tokens + 1;
  st.out[size_t(k)].put(first, out_.hidden.data() + size_t(out_.hidden_offset[c]) * E, chunks_[c].n_tokens);
  pools_[size_t(b)]->trim_swa(st.kv[size_t(b)]);
  const float* row = out_.logits.data() + size_t(out_.logits_offset[c]) * V;
  std::vector<Sampler::TokenProb> q;
  int32_t d;
  if (job.sampler) {
    job.sampler->distribution(row, q);
    d = q.back().token;
    if (q.size() > 1) {
      const double u = job.sampler->uniform();
      double cum = 0;
      for (const auto& tp : q) {
        cum += tp.p;
        if (u < cum) {
          d = tp.token;
          break;
        }
      }
    }
    job.sampler->accept(d);  // later drafts see it in the penalty history
  } else {
    d = Sampler::argmax(row, V);
    q.push_back({d, 1.0});
  }
  if (draft_override) {
    d = draft_override(job.n_pos, k, d);
    q.assign(1, Sampler::TokenProb{d, 1.0});
  }
  st.drafts.push_back(d);
  st.q.push_back(std::move(q));
}

void MtpDrafter::commit(MtpState& st, int32_t n_pos_old, int32_t n_pos_new, int32_t k_used) {
  if (!st.synced || k_used <= 0) return;
  const int32_t steps = n_blocks_ == 1 ? 1 : k_used;  // a reused block: only step 0's entries are canonical
  for (int32_t k = 0; k < steps; ++k) {
    const int32_t b = block_of_step(k);
    KvPool& pool = *pools_[size_t(b)];
    KvSeq& kv = st.kv[size_t(b)];
    const int32_t frontier = std::min(n_pos_old + k + 1, n_pos_new);
    const int32_t slots = frontier - st.base[size_t(b)];
    if (slots < kv.n_pos) {
      if (slots >= 0 && pool.can_truncate(kv, slots)) {
        pool.truncate(kv, slots);
      } else {
        st.synced = false;
        return;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------

int32_t verify_drafts(Sampler& sampler, const float* rows, size_t n_vocab, const std::vector<int32_t>& drafts,
                      const std::vector<std::vector<Sampler::TokenProb>>& q, double synthetic_accept,
                      std::vector<int32_t>& out) {
  const size_t K = drafts.size();
  std::vector<Sampler::TokenProb> p;
  for (size_t i = 0; i <= K; ++i) {
    const float* row = rows + i * n_vocab;
    if (i == K) {  // every draft accepted: the bonus token from the last row
      const int32_t t = sampler.sample(row);
      sampler.accept(t);
      out.push_back(t);
      return int32_t(K);
    }
    const int32_t d = drafts[i];
    if (synthetic_accept >= 0) {
      // Benchmark mode: acceptance by coin flip; the text is not meaningful.
      if (sampler.uniform() < synthetic_accept) {
        sampler.accept(d);
        out.push_back(d);
        continue;
      }
      const int32_t t = sampler.sample(row);
      sampler.accept(t);
      out.push_back(t);
      return int32_t(i);
    }
    sampler.distribution(row, p);
    double pd = 0, qd = 0;
    for (const auto& tp : p)
      if (tp.token == d) pd = tp.p;
    for (const auto& tp : q[i])
      if (tp.token == d) qd = tp.p;
    const bool greedy = p.size() == 1 && q[i].size() == 1;
    const bool accept = greedy ? pd > 0 : (qd > 0 && sampler.uniform() * qd < pd);
    if (accept) {
      sampler.accept(d);
      out.push_back(d);
      continue;
    }
    // Rejected: draw from the residual max(0, p - q), renormalised.
    int32_t t;
    if (greedy) {
      t = p[0].token;
    } else {
      std::vector<Sampler::TokenProb> r;
      double mass = 0;
      for (const auto& tp : p) {
        double qt = 0;
        for (const auto& tq : q[i])
          if (tq.token == tp.token) qt = tq.p;
        const double w = std::max(0.0, tp.p - qt);
        if (w > 0) r.push_back({tp.token, w}), mass += w;
      }
      if (r.empty()) r = p, mass = 1.0;  // p == q up to rounding
      const double u = sampler.uniform() * mass;
      double cum = 0;
      t = r.back().token;
      for (const auto& tr : r) {
        cum += tr.p;
        if (u < cum) {
          t = tr.token;
          break;
        }
      }
    }
    sampler.accept(t);
    out.push_back(t);
    return int32_t(i);
  }
  return int32_t(K);
}

// ---------------------------------------------------------------------------------------

AdaptiveK::AdaptiveK(int32_t max_k) : max_k_(std::clamp(max_k, 0, kMaxDrafts)) {}

namespace {
// Running mean of the first samples, then an exponential average that follows drift
// (another process on the cores, a different batch).
void running_mean(double& v, uint64_t& n, double x) {
  ++n;
  const double a = std::max(1.0 / double(n), 0.1);
  v += a * (x - v);
}
constexpr double kAcceptDecay = 0.97;  // acceptance counts forget with ~33 observations
}  // namespace

double AdaptiveK::acceptance(int32_t pos) const {
  pos = std::clamp(pos, 1, kMaxDrafts);
  // Position 1: a uniform prior (one hit in two trials); later positions lean on the
  // estimate of the position before until they have observations of their own.
  const double prior = pos == 1 ? 0.5 : acceptance(pos - 1);
  return (hits_[pos] + 2.0 * prior) / (trials_[pos] + 2.0);
}

double AdaptiveK::verify_cost(int32_t k) const {
  k = std::clamp(k, 0, max_k_);
  const double c0 = trunk_[0];
  if (trunk_n_[0] == 0) return 0;
  // Slope per extra token from the largest K measured so far (one full step per extra
  // token before any: pessimistic, so unmeasured K is not preferred by accident).
  double slope = c0;
  for (int32_t j = max_k_; j >= 1; --j)
    if (trunk_n_[j] > 0) {
      slope = std::max(0.0, (trunk_[j] - c0) / double(j));
      break;
    }
  double v = c0;
  for (int32_t i = 1; i <= k; ++i) v = std::max(v, trunk_n_[i] > 0 ? trunk_[i] : c0 + slope * double(i));
  return v;
}

double AdaptiveK::draft_cost() const {
  if (draft_n_ > 0) return draft_;
  if (draft_rough_ > 0) return draft_rough_;
  return trunk_[0];  // unknown: as dear as a decode step, until measured
}

double AdaptiveK::expected_tokens(int32_t k) const {
  double e = 1, run = 1;
  for (int32_t i = 1; i <= k; ++i) e += (run *= acceptance(i));
  return e;
}

double AdaptiveK::rate(int32_t k) const {
  const double cost = verify_cost(k) + double(k) * draft_cost();
  return cost > 0 ? expected_tokens(k) / cost : 0;
}

int32_t AdaptiveK::best_k() const {
  if (trunk_n_[0] == 0) return 0;
  int32_t best = 0;
  double best_rate = rate(0);
  for (int32_t k = 1; k <= max_k_; ++k) {
    const double r = rate(k);
    if (r > best_rate) best = k, best_rate = r;
  }
  return best;
}

int32_t AdaptiveK::choose() {
  ++step_;
  last_probe_ = false;
  if (max_k_ == 0 || trunk_n_[0] == 0) return last_ = 0;  // plain steps measure c_0 first
  const int32_t best = best_k();
  if (best > 0) return last_ = best;
  if (step_ < next_probe_) return last_ = 0;
  // Before the first probe its cost is unknown: assume two decode steps.
  const double expected = last_probe_overhead_s_ >= 0 ? last_probe_overhead_s_ : 2.0 * trunk_[0];
  if (probe_overhead_s_ + expected > kProbeBudget * elapsed_s_) return last_ = 0;
  // Speculation does not look worth it: try one draft to see whether that still holds.
  last_probe_ = probe_pending_ = true;
  probe_accepted_ = 0;
  ++probes_;
  return last_ = 1;
}

void AdaptiveK::record_acceptance(int32_t k, int32_t accepted) {
  k = std::clamp(k, 0, max_k_);
  for (int32_t i = 1; i <= k && i <= accepted + 1; ++i) {
    hits_[i] = kAcceptDecay * hits_[i] + (i <= accepted ? 1.0 : 0.0);
    trials_[i] = kAcceptDecay * trials_[i] + 1.0;
  }
  if (probe_pending_) probe_accepted_ = std::max(probe_accepted_, std::min(accepted, k));
}

void AdaptiveK::record_cost(int32_t k, double trunk_s, double draft_s, int64_t catch_up) {
  k = std::clamp(k, 0, max_k_);
  running_mean(trunk_[k], trunk_n_[k], trunk_s);
  elapsed_s_ += trunk_s + draft_s;
  if (k > 0) {
    if (catch_up <= 0)
      running_mean(draft_, draft_n_, draft_s / double(k));
    else if (draft_n_ == 0)
      running_mean(draft_rough_, draft_rough_n_, draft_s / double(k + catch_up));
  }
  if (!probe_pending_) return;
  probe_pending_ = false;
  if (k == 0) return;  // no draft could be made: try again at the next chance
  // A probe pays when its own step beat plain decoding (drafting counted at its in-step
  // cost), or when what it taught makes speculation the better choice.
  last_probe_overhead_s_ = std::max(0.0, trunk_s + draft_s - double(1 + probe_accepted_) * trunk_[0]);
  probe_overhead_s_ += last_probe_overhead_s_;
  const double cost = trunk_s + double(k) * draft_cost();
  const bool paid = double(1 + probe_accepted_) * trunk_[0] >= cost || best_k() > 0;
  if (paid) {
    ++paying_probes_;
    probe_gap_ = kFirstProbeGap;
  } else if (probes_ > 1) {
    probe_gap_ = std::min(probe_gap_ * 2, kMaxProbeGap);
  }
  next_probe_ = step_ + probe_gap_;
}

// ---------------------------------------------------------------------------------------

Speculation::Speculation(const Model& model, int32_t max_k, bool adaptive, int32_t max_seqs, int32_t n_ctx,
                         KvTypes kv_types)
    : drafter_(model, max_k, max_seqs, n_ctx, kv_types), adaptive_k_(drafter_.max_k()), adaptive_(adaptive) {}

void Speculation::draft(const std::vector<Sequence*>& seqs, ThreadPool& pool, Workspace& ws, Precision precision) {
  last_draft_s_ = 0;
  last_catch_up_ = 0;
  if (max_k() == 0) return;
  bool decoding = false;
  for (const Sequence* s : seqs) decoding |= !s->prefilling();
  if (!decoding) return;
  const int32_t k = adaptive_ ? adaptive_k_.choose() : max_k();
  const bool probe = adaptive_ && adaptive_k_.last_was_probe();
  jobs_.clear();
  for (Sequence* s : seqs)
    if (std::optional<MtpDrafter::Job> job = s->draft_job(k, probe)) jobs_.push_back(*job);
  if (jobs_.empty()) return;
  const double t0 = steady_seconds();
  try {
    drafter_.draft(jobs_, pool, ws, precision);
  } catch (const std::exception&) {
    for (MtpDrafter::Job& j : jobs_) j.st->drafts.clear(), j.st->q.clear(), j.st->synced = false;
  }
  last_draft_s_ = steady_seconds() - t0;
  last_catch_up_ = drafter_.catch_up_tokens();
}

void Speculation::record_pass(int32_t k, double trunk_s) {
  if (max_k() > 0) adaptive_k_.record_cost(k, trunk_s, last_draft_s_, last_catch_up_);
}

}  // namespace step35
