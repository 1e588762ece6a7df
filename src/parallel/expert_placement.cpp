#include "parallel/expert_placement.h"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace step35 {

namespace {

nlohmann::json parse_json(const std::string& text, const char* what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string(what) + ": not valid JSON: " + e.what());
  }
}

int layer_key(const std::string& k, const char* what) {
  size_t used = 0;
  int il = -1;
  try {
    il = std::stoi(k, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != k.size() || il < 0) throw std::runtime_error(std::string(what) + ": layer key '" + k + "' is not a block index");
  return il;
}

int32_t positive_int(const nlohmann::json& j, const char* key, const char* what) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 1 ||
      j[key].get<int64_t>() > (1 << 20))
    throw std::runtime_error(std::string(what) + ": \"" + key + "\" must be a positive integer");
  return int32_t(j[key].get<int64_t>());
}

// A counts or placement file: the fields of `head` and the "layers" object, one array per
// block index.
template <typename Layers>
std::string layers_file(nlohmann::json head, const Layers& layers) {
  head["layers"] = nlohmann::json::object();
  for (const auto& [il, v] : layers) head["layers"][std::to_string(il)] = v;
  return head.dump();
}

// Calls each(block index, key, array) for the entries of the "layers" object, which must be
// there; `what` names the file in errors.
template <typename Each>
void for_each_layer(const nlohmann::json& j, const char* what, Each each) {
  if (!j.contains("layers") || !j["layers"].is_object())
    throw std::runtime_error(std::string(what) + ": \"layers\" must be an object");
  for (const auto& [k, v] : j["layers"].items()) each(layer_key(k, what), k, v);
}

}  // namespace

void ExpertCounts::add(int il, const int32_t* counts, int64_t n) {
  if (n_expert == 0) n_expert = int32_t(n);
  if (n != n_expert) throw std::invalid_argument("expert counts: blocks with different expert counts");
  auto& v = layers[il];
  v.resize(size_t(n), 0);
  for (int64_t e = 0; e < n; ++e) v[size_t(e)] += counts[e];
}

std::string ExpertCounts::to_json() const { return layers_file({{"n_expert", n_expert}}, layers); }

ExpertCounts ExpertCounts::from_json(const std::string& text) {
  const char* what = "expert counts";
  const nlohmann::json j = parse_json(text, what);
  ExpertCounts c;
  c.n_expert = positive_int(j, "n_expert", what);
  for_each_layer(j, what, [&](int il, const std::string& k, const nlohmann::json& v) {
    if (!v.is_array() || v.size() != size_t(c.n_expert))
      throw std::runtime_error("expert counts: layer " + k + " must list " + std::to_string(c.n_expert) + " counts");
    std::vector<int64_t> counts;
    for (const auto& x : v) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0)
        throw std::runtime_error("expert counts: layer " + k + " has a count that is not a non-negative integer");
      counts.push_back(x.get<int64_t>());
    }
    c.layers[il] = std::move(counts);
  });
  return c;
}

ExpertPlacement::ExpertPlacement(int32_t n_ranks, int32_t n_expert) : n_ranks_(n_ranks), n_expert_(n_expert) {
  if (n_ranks < 1 || n_expert < 1) throw std::invalid_argument("expert placement: ranks and experts must be positive");
}

int32_t ExpertPlacement::owner(int il, int32_t e) const {
  auto it = layers_.find(il);
  if (it != layers_.end()) return it->second[size_t(e)];
  return contiguous_owner(e, n_ranks_, n_expert_);
}

void ExpertPlacement::set_layer(int il, std::vector<int32_t> owners) {
  if (owners.size() != size_t(n_expert_))
    throw std::invalid_argument("expert placement: layer " + std::to_string(il) + " must list " +
                                std::to_string(n_expert_) + " ranks");
  for (int32_t r : owners)
    if (r < 0 || r >= n_ranks_)
      throw std::invalid_argument("expert placement: layer " + std::to_string(il) + " names rank " + std::to_string(r) +
                                  " (ranks are 0.." + std::to_string(n_ranks_ - 1) + ")");
  layers_[il] = std::move(owners);
}

std::string ExpertPlacement::to_json() const {
  return layers_file({{"n_ranks", n_ranks_}, {"n_expert", n_expert_}}, layers_);
}

ExpertPlacement ExpertPlacement::from_json(const std::string& text) {
  const char* what = "expert placement";
  const nlohmann::json j = parse_json(text, what);
  ExpertPlacement p(positive_int(j, "n_ranks", what), positive_int(j, "n_expert", what));
  for_each_layer(j, what, [&](int il, const std::string& k, const nlohmann::json& v) {
    if (!v.is_array()) throw std::runtime_error("expert placement: layer " + k + " must be an array of ranks");
    std::vector<int32_t> owners;
    for (const auto& x : v) {
      if (!x.is_number_integer()) throw std::runtime_error("expert placement: layer " + k + " has a rank that is not an integer");
      owners.push_back(int32_t(std::clamp<int64_t>(x.get<int64_t>(), -1, int64_t(1) << 30)));
    }
    try {
      p.set_layer(il, std::move(owners));
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(e.what());
    }
  });
  return p;
}

std::vector<int64_t> rank_loads(const ExpertPlacement& p, int il, const std::vector<int64_t>& counts) {
  std::vector<int64_t> loads(size_t(p.n_ranks()), 0);
  for (size_t e = 0; e < counts.size() && e < size_t(p.n_expert()); ++e) loads[size_t(p.owner(il, int32_t(e)))] += counts[e];
  return loads;
}

double imbalance(const std::vector<int64_t>& loads) {
  if (loads.empty()) return 1.0;
  const int64_t total = std::accumulate(loads.begin(), loads.end(), int64_t(0));
  if (total == 0) return 1.0;
  const int64_t mx = *std::max_element(loads.begin(), loads.end());
  return double(mx) * double(loads.size()) / double(total);
}

ExpertPlacement plan_placement(const ExpertCounts& counts, int32_t n_ranks) {
  if (counts.n_expert < 1) throw std::invalid_argument("ep-plan: the counts name no experts");
  ExpertPlacement p(n_ranks, counts.n_expert);
  const int32_t X = counts.n_expert;
  const int32_t cap = (X + n_ranks - 1) / n_ranks;
  for (const auto& [il, layer_counts] : counts.layers) {
    // A named reference: clang before 16 cannot capture a structured binding in a lambda.
    const auto& c = layer_counts;
    std::vector<int32_t> order(static_cast<size_t>(X));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return c[size_t(a)] > c[size_t(b)]; });
    std::vector<int64_t> load(size_t(n_ranks), 0);
    std::vector<int32_t> held(size_t(n_ranks), 0), owners(size_t(X), 0);
    for (int32_t e : order) {
      int32_t best = -1;
      for (int32_t r = 0; r < n_ranks; ++r)
        if (held[size_t(r)] < cap && (best < 0 || load[size_t(r)] < load[size_t(best)])) best = r;
      owners[size_t(e)] = best;
      load[size_t(best)] += c[size_t(e)];
      ++held[size_t(best)];
    }
    p.set_layer(il, std::move(owners));
  }
  return p;
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << text << '\n';
  if (!f.flush()) throw std::runtime_error("cannot write " + path);
}

}  // namespace step35
