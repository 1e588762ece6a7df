#include "train/params.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "model/step35.h"
#include "tensor/quants.h"
#include "train/linear.h"

namespace step35::train {

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t p = s.find(sep, start);
    if (p == std::string::npos) p = s.size();
    out.push_back(trim(s.substr(start, p - start)));
    start = p + 1;
  }
  return out;
}

int32_t parse_int(const std::string& s, const std::string& what) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
    throw std::invalid_argument("--train: expected a number for " + what + ", got '" + s + "'");
  return int32_t(std::stol(s));
}

const char* kExpertTensors[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
const char* kSharedTensors[3] = {"ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"};

}  // namespace

TrainGroups TrainGroups::parse(const std::string& text) {
  TrainGroups g;
  for (const std::string& part : split(text, ';')) {
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    if (eq == std::string::npos)
      throw std::invalid_argument("--train: expected GROUP=LIST (experts=, router= or shared=), got '" + part + "'");
    const std::string kind = trim(part.substr(0, eq));
    const std::vector<std::string> items = split(part.substr(eq + 1), ',');
    for (const std::string& item : items) {
      if (item.empty()) throw std::invalid_argument("--train: empty item in '" + part + "'");
      if (kind == "experts") {
        const size_t colon = item.find(':');
        if (colon == std::string::npos)
          throw std::invalid_argument("--train: experts are LAYER:EXPERT or LAYER:topN, got '" + item + "'");
        const int32_t layer = parse_int(item.substr(0, colon), "a layer in '" + item + "'");
        const std::string rest = item.substr(colon + 1);
        if (rest.rfind("top", 0) == 0) {
          const int32_t n = parse_int(rest.substr(3), "N in '" + item + "'");
          if (n < 1) throw std::invalid_argument("--train: topN needs N >= 1 in '" + item + "'");
          g.top_experts.push_back({layer, n});
        } else {
          g.experts.push_back({layer, parse_int(rest, "an expert in '" + item + "'")});
        }
      } else if (kind == "router") {
        g.routers.push_back(parse_int(item, "a router layer"));
      } else if (kind == "shared") {
        g.shared.push_back(parse_int(item, "a shared-expert layer"));
      } else {
        throw std::invalid_argument("--train: unknown group '" + kind + "' (expected experts, router or shared)");
      }
    }
  }
  std::sort(g.experts.begin(), g.experts.end());
  g.experts.erase(std::unique(g.experts.begin(), g.experts.end()), g.experts.end());
  for (auto* v : {&g.routers, &g.shared}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  if (g.empty()) throw std::invalid_argument("--train: nothing to train in '" + text + "'");
  return g;
}

std::string TrainGroups::to_string() const {
  std::string s;
  auto add_group = [&](const std::string& name, const std::vector<std::string>& items) {
    if (items.empty()) return;
    if (!s.empty()) s += ";";
    s += name + "=";
    for (size_t i = 0; i < items.size(); ++i) s += (i ? "," : "") + items[i];
  };
  std::vector<std::string> ex;
  for (const Expert& e : experts) ex.push_back(std::to_string(e.layer) + ":" + std::to_string(e.expert));
  for (const TopExperts& t : top_experts) ex.push_back(std::to_string(t.layer) + ":top" + std::to_string(t.n));
  add_group("experts", ex);
  std::vector<std::string> r, sh;
  for (int32_t l : routers) r.push_back(std::to_string(l));
  for (int32_t l : shared) sh.push_back(std::to_string(l));
  add_group("router", r);
  add_group("shared", sh);
  return s;
}

void TrainGroups::check(const Model& m) const {
  const HParams& hp = m.hparams();
  auto moe_layer = [&](int32_t il, const char* group) {
    if (il < 0 || il >= hp.n_layer)
      throw std::invalid_argument(std::string("--train ") + group + ": layer " + std::to_string(il) +
                                  " is not a trunk layer (0.." + std::to_string(hp.n_layer - 1) + ")");
    if (!hp.layers[size_t(il)].is_moe)
      throw std::invalid_argument(std::string("--train ") + group + ": layer " + std::to_string(il) +
                                  " is a dense layer (no experts, no router)");
  };
  for (const Expert& e : experts) {
    moe_layer(e.layer, "experts");
    if (e.expert < 0 || e.expert >= hp.n_expert)
      throw std::invalid_argument("--train experts: expert " + std::to_string(e.expert) + " does not exist (0.." +
                                  std::to_string(hp.n_expert - 1) + ")");
  }
  for (const TopExperts& t : top_experts) {
    moe_layer(t.layer, "experts");
    if (t.n > hp.n_expert)
      throw std::invalid_argument("--train experts: top" + std::to_string(t.n) + " of " +
                                  std::to_string(hp.n_expert) + " experts");
  }
  for (int32_t il : routers) moe_layer(il, "router");
  for (int32_t il : shared) {
    moe_layer(il, "shared");
    if (!m.layer(il).ffn_up_shexp.present())
      throw std::invalid_argument("--train shared: layer " + std::to_string(il) + " has no shared expert");
  }
}

WeightMatrix TrainedTensor::matrix() const { return f32_matrix(value.data(), n_in, n_out); }

TrainedParams TrainedParams::from_model(const Model& m, const TrainGroups& groups) {
  if (!groups.top_experts.empty()) throw std::logic_error("TrainedParams: unresolved topN experts");
  groups.check(m);
  TrainedParams p;
  p.groups_ = groups;
  auto add = [&](const std::string& name, int il, int32_t expert, const WeightMatrix& w) {
    TrainedTensor t;
    t.tensor = name;
    t.layer = il;
    t.expert = expert;
    t.n_in = w.n_in;
    t.n_out = w.n_out;
    const size_t n = size_t(w.n_in * w.n_out);
    t.value.resize(n);
    for (int64_t o = 0; o < w.n_out; ++o) dequantize_row(w, o, t.value.data() + o * w.n_in);
    t.grad.assign(n, 0.0f);
    t.m.assign(n, 0.0f);
    t.v.assign(n, 0.0f);
    p.index_[name + "#" + std::to_string(expert)] = p.tensors_.size();
    p.tensors_.push_back(std::move(t));
  };
  for (const TrainGroups::Expert& e : groups.experts) {
    const LayerWeights& W = m.layer(e.layer);
    const WeightMatrix* mats[3] = {&W.ffn_gate_exps, &W.ffn_up_exps, &W.ffn_down_exps};
    for (int k = 0; k < 3; ++k) add(block_tensor_name(e.layer, kExpertTensors[k]), e.layer, e.expert, mats[k]->matrix(e.expert));
  }
  for (int32_t il : groups.routers) add(block_tensor_name(il, "ffn_gate_inp.weight"), il, -1, m.layer(il).ffn_gate_inp);
  for (int32_t il : groups.shared) {
    const LayerWeights& W = m.layer(il);
    const WeightMatrix* mats[3] = {&W.ffn_gate_shexp, &W.ffn_up_shexp, &W.ffn_down_shexp};
    for (int k = 0; k < 3; ++k) add(block_tensor_name(il, kSharedTensors[k]), il, -1, *mats[k]);
  }
  return p;
}

int TrainedParams::find(int il, int32_t expert, const std::string& suffix) const {
  auto it = index_.find(block_tensor_name(il, suffix.c_str()) + "#" + std::to_string(expert));
  return it == index_.end() ? -1 : int(it->second);
}

const TrainedTensor* TrainedParams::expert(int il, int32_t e, Matrix m) const {
  const int i = find(il, e, kExpertTensors[m]);
  return i < 0 ? nullptr : &tensors_[size_t(i)];
}
TrainedTensor* TrainedParams::expert(int il, int32_t e, Matrix m) {
  return const_cast<TrainedTensor*>(static_cast<const TrainedParams*>(this)->expert(il, e, m));
}
const TrainedTensor* TrainedParams::router(int il) const {
  const int i = find(il, -1, "ffn_gate_inp.weight");
  return i < 0 ? nullptr : &tensors_[size_t(i)];
}
TrainedTensor* TrainedParams::router(int il) {
  return const_cast<TrainedTensor*>(static_cast<const TrainedParams*>(this)->router(il));
}
const TrainedTensor* TrainedParams::shared(int il, Matrix m) const {
  const int i = find(il, -1, kSharedTensors[m]);
  return i < 0 ? nullptr : &tensors_[size_t(i)];
}
TrainedTensor* TrainedParams::shared(int il, Matrix m) {
  return const_cast<TrainedTensor*>(static_cast<const TrainedParams*>(this)->shared(il, m));
}

bool TrainedParams::layer_has_experts(int il) const {
  for (const TrainGroups::Expert& e : groups_.experts)
    if (e.layer == il) return true;
  return false;
}

int TrainedParams::lowest_layer() const {
  int lo = -1;
  for (const TrainedTensor& t : tensors_) lo = lo < 0 ? t.layer : std::min(lo, t.layer);
  return lo;
}

int64_t TrainedParams::n_values() const {
  int64_t n = 0;
  for (const TrainedTensor& t : tensors_) n += int64_t(t.size());
  return n;
}

void TrainedParams::zero_grad() {
  for (TrainedTensor& t : tensors_) std::fill(t.grad.begin(), t.grad.end(), 0.0f);
}

float AdamW::lr_at(int64_t step) const {
  if (c_.warmup_steps > 0 && step < c_.warmup_steps) return c_.lr * float(step + 1) / float(c_.warmup_steps);
  return c_.lr;
}

double AdamW::step(TrainedParams& p) {
  double sq = 0;
  for (const TrainedTensor& t : p.tensors())
    for (float g : t.grad) sq += double(g) * g;
  const double norm = std::sqrt(sq);
  const float clip = c_.clip_norm > 0 && norm > c_.clip_norm ? float(c_.clip_norm / norm) : 1.0f;
  const float lr = lr_at(t_);
  ++t_;
  const double bc1 = 1.0 - std::pow(double(c_.beta1), double(t_));
  const double bc2 = 1.0 - std::pow(double(c_.beta2), double(t_));
  for (TrainedTensor& t : p.tensors())
    for (size_t i = 0; i < t.size(); ++i) {
      const float g = t.grad[i] * clip;
      t.m[i] = c_.beta1 * t.m[i] + (1.0f - c_.beta1) * g;
      t.v[i] = c_.beta2 * t.v[i] + (1.0f - c_.beta2) * g * g;
      const double mhat = t.m[i] / bc1, vhat = t.v[i] / bc2;
      t.value[i] -= float(lr * (mhat / (std::sqrt(vhat) + c_.eps) + c_.weight_decay * t.value[i]));
    }
  return norm;
}

}  // namespace step35::train
