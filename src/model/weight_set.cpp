// Model::set_replacements: the file's weights with some matrices replaced (model patches),
// published as a new WeightSet that forward passes pick up when they start.
#include <map>
#include <stdexcept>

#include "model/step35.h"

namespace step35 {

namespace {

// The matrix a replacement names in a block's weights (null: not replaceable), and
// whether it is a 3-D expert tensor.
WeightMatrix* target(LayerWeights& W, const std::string& name, bool* is_experts) {
  *is_experts = false;
  const std::pair<const char*, WeightMatrix*> whole[] = {
      {"attn_q.weight", &W.attn_q},           {"attn_k.weight", &W.attn_k},
      {"attn_v.weight", &W.attn_v},           {"attn_gate.weight", &W.attn_gate},
      {"attn_output.weight", &W.attn_output}, {"ffn_gate.weight", &W.ffn_gate},
      {"ffn_up.weight", &W.ffn_up},           {"ffn_down.weight", &W.ffn_down},
      {"ffn_gate_inp.weight", &W.ffn_gate_inp}, {"ffn_gate_shexp.weight", &W.ffn_gate_shexp},
      {"ffn_up_shexp.weight", &W.ffn_up_shexp}, {"ffn_down_shexp.weight", &W.ffn_down_shexp}};
  for (const auto& [n, w] : whole)
    if (name == n) return w;
  const std::pair<const char*, WeightMatrix*> experts[] = {{"ffn_gate_exps.weight", &W.ffn_gate_exps},
                                                           {"ffn_up_exps.weight", &W.ffn_up_exps},
                                                           {"ffn_down_exps.weight", &W.ffn_down_exps}};
  for (const auto& [n, w] : experts)
    if (name == n) {
      *is_experts = true;
      return w;
    }
  return nullptr;
}

// "blk.12.ffn_up_exps.weight" -> 12 and "ffn_up_exps.weight"; -1 when not a block tensor.
int parse_block(const std::string& tensor, std::string* rest) {
  if (tensor.rfind("blk.", 0) != 0) return -1;
  const size_t dot = tensor.find('.', 4);
  if (dot == std::string::npos || dot == 4 || dot > 10) return -1;
  int il = 0;
  for (size_t i = 4; i < dot; ++i) {
    if (tensor[i] < '0' || tensor[i] > '9') return -1;
    il = il * 10 + (tensor[i] - '0');
  }
  *rest = tensor.substr(dot + 1);
  return il;
}

std::string describe(const MatrixReplacement& r) {
  return r.expert >= 0 ? r.tensor + " expert " + std::to_string(r.expert) : r.tensor;
}

}  // namespace

std::shared_ptr<const WeightSet> Model::weights() const {
  std::lock_guard<std::mutex> lock(weights_mu_);
  return weights_;
}

void Model::set_replacements(std::vector<MatrixReplacement> replacements) {
  auto set = std::make_shared<WeightSet>();
  set->layers = layers_;
  // Later entries win: keep the last one per (tensor, expert), in first-seen order.
  std::map<std::pair<std::string, int32_t>, size_t> last;
  for (size_t i = 0; i < replacements.size(); ++i) last[{replacements[i].tensor, replacements[i].expert}] = i;
  std::map<WeightMatrix*, MatrixSlots*> slots_of;
  for (size_t i = 0; i < replacements.size(); ++i) {
    const MatrixReplacement& r = replacements[i];
    if (last[{r.tensor, r.expert}] != i) continue;
    std::string name;
    const int il = parse_block(r.tensor, &name);
    if (il < 0 || il >= int(layers_.size()))
      throw std::invalid_argument("replacement " + describe(r) + ": not a tensor of this model's blocks");
    bool is_experts = false;
    WeightMatrix* w = target(set->layers[size_t(il)], name, &is_experts);
    if (!w || !w->present())
      throw std::invalid_argument("replacement " + describe(r) + ": this model has no such replaceable tensor");
    if (is_experts != (r.expert >= 0))
      throw std::invalid_argument("replacement " + describe(r) + (is_experts ? ": an expert tensor needs an expert id"
                                                                             : ": not an expert tensor"));
    if (is_experts && r.expert >= w->n_mat)
      throw std::invalid_argument("replacement " + describe(r) + ": the tensor has " + std::to_string(w->n_mat) +
                                  " experts");
    const DTypeInfo* info = dtype_info(uint32_t(r.type));
    const std::optional<size_t> rb = info ? row_bytes(r.type, w->n_in) : std::nullopt;
    if (!rb)
      throw std::invalid_argument("replacement " + describe(r) + ": type " +
                                  (info ? std::string(info->name) : std::to_string(uint32_t(r.type))) +
                                  " cannot hold rows of " + std::to_string(w->n_in));
    if (!r.data || r.n_bytes != *rb * size_t(w->n_out))
      throw std::invalid_argument("replacement " + describe(r) + ": " + std::to_string(r.n_bytes) + " bytes, expected " +
                                  std::to_string(*rb * size_t(w->n_out)) + " (" + std::to_string(w->n_out) +
                                  " rows of " + std::to_string(w->n_in) + " " + info->name + ")");
    WeightMatrix m;
    m.data = r.data;
    m.type = r.type;
    m.n_in = w->n_in;
    m.n_out = w->n_out;
    m.row_bytes = *rb;
    if (kernels::can_repack(m)) set->packed.push_back(kernels::repack(m));
    if (is_experts) {
      MatrixSlots*& s = slots_of[w];
      if (!s) {
        set->slots.push_back(std::make_unique<MatrixSlots>());
        s = set->slots.back().get();
        s->mats.resize(size_t(w->n_mat));
        w->slots = s;
      }
      s->mats[size_t(r.expert)] = m;
    } else {
      *w = m;
    }
  }
  // Under a memory budget, an expert swapped for a replacement gives its slot back: passes
  // from now on read the replacement (a partly replaced expert reads its other matrices
  // into a slot again when routed to).
  if (expert_cache_)
    for (const MatrixReplacement& r : replacements) {
      std::string name;
      if (r.expert >= 0) expert_cache_->drop(parse_block(r.tensor, &name), r.expert);
    }
  set->replacements = std::move(replacements);
  std::lock_guard<std::mutex> lock(weights_mu_);
  set->version = ++weights_version_;
  weights_ = std::move(set);
}

}  // namespace step35
