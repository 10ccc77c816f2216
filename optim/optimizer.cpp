// Optimizer base: groups, validation, the blocked parallel step, and state
// save/restore. The update rules live in sgd.cpp and adam.cpp.
#include "tapeformer/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"

namespace tapeformer {

std::vector<ParamGroup> decay_groups(const NamedVars& params, float lr, float weight_decay) {
  ParamGroup decay{{}, lr, weight_decay}, no_decay{{}, lr, 0.0f};
  for (const auto& p : params) {
    TAPEFORMER_CHECK(p.second.defined(), "decay_groups: parameter '", p.first, "' is undefined");
    if (!p.second.requires_grad()) continue;  // frozen, as nanoGPT filters them
    (p.second.rank() >= 2 ? decay : no_decay).params.push_back(p);
  }
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, std::vector<std::string> buffer_names)
    : name_(std::move(name)), groups_(std::move(groups)), buffer_names_(std::move(buffer_names)) {
  TAPEFORMER_CHECK(buffer_names_.size() <= kMaxBuffers, name_, ": at most ", kMaxBuffers, " buffers");
  std::map<std::string, size_t> names;  // parameter name -> group
  std::map<const Node*, std::string> nodes;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    TAPEFORMER_CHECK(std::isfinite(g.lr) && g.lr >= 0, name_, ": group ", gi, " lr must be finite and >= 0, got ",
                     g.lr);
    TAPEFORMER_CHECK(std::isfinite(g.weight_decay) && g.weight_decay >= 0, name_, ": group ", gi,
                     " weight_decay must be finite and >= 0, got ", g.weight_decay);
    auto& group_state = state_.emplace_back();
    for (const auto& [pname, p] : g.params) {
      TAPEFORMER_CHECK(p.defined(), name_, ": parameter '", pname, "' (group ", gi, ") is undefined");
      TAPEFORMER_CHECK(p.value().is_contiguous(), name_, ": parameter '", pname, "' must be contiguous, got ",
                       p.value());
      auto [it, fresh] = names.emplace(pname, gi);
      TAPEFORMER_CHECK(fresh, name_, ": parameter name '", pname, "' appears twice (groups ", it->second, " and ",
                       gi, ")");
      auto [nt, fresh_node] = nodes.emplace(p.node(), pname);
      TAPEFORMER_CHECK(fresh_node, name_, ": the same parameter appears as '", nt->second, "' and '", pname, "'");
      ParamState& s = group_state.emplace_back();
      for (size_t b = 0; b < buffer_names_.size(); ++b) s.buffers.push_back(Tensor::zeros(p.shape()));
    }
  }
  TAPEFORMER_CHECK(!names.empty(), name_, ": got an empty parameter list");
}

// Validates everything before the first write, so a bad parameter never
// leaves the model half-updated.
void Optimizer::check_ready() const {
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      const auto& [pname, p] = groups_[gi].params[pi];
      const Shape& shape = state_[gi][pi].buffers.empty() ? p.shape() : state_[gi][pi].buffers[0].shape();
      TAPEFORMER_CHECK(p.shape() == shape, name_, ": parameter '", pname, "' changed shape from ", shape, " to ",
                       p.shape());
      if (!p.has_grad()) continue;
      TAPEFORMER_CHECK(p.value().is_contiguous(), name_, ": parameter '", pname, "' must be contiguous, got ",
                       p.value());
      TAPEFORMER_CHECK(p.grad().shape() == p.shape(), name_, ": gradient of '", pname, "' has shape ",
                       p.grad().shape(), " vs parameter ", p.shape());
    }
  }
}

void Optimizer::step(float grad_scale) {
  TAPEFORMER_CHECK(std::isfinite(grad_scale) && grad_scale > 0, name_, ": grad_scale must be finite and > 0, got ",
                   grad_scale);
  check_ready();
  ++steps_;
  // Every parameter with a gradient, then one parallel pass over all their
  // blocks. Block boundaries are multiples of kBlock, independent of the
  // thread count, so every element is computed identically on any machine.
  struct Item {
    const ParamGroup* group;
    int64_t step;
    Block whole;
  };
  std::vector<Item> items;
  std::vector<int64_t> sizes;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    for (size_t pi = 0; pi < g.params.size(); ++pi) {
      Var p = g.params[pi].second;  // a handle: its value is written below
      if (!p.has_grad()) continue;
      const Tensor& grad = p.dense_grad();
      ParamState& s = state_[gi][pi];
      Block whole{p.value().data(), grad.data(), {}, p.numel(), grad_scale};
      for (size_t b = 0; b < s.buffers.size(); ++b) whole.buffers[b] = s.buffers[b].data();
      items.push_back({&g, ++s.step, whole});
      sizes.push_back(whole.n);
    }
  }
  parallel::for_each_block(sizes, kBlock, [&](size_t i, int64_t begin, int64_t end) {
    const Item& it = items[i];
    Block blk = it.whole;
    blk.param += begin;
    blk.grad += begin;
    for (auto& buf : blk.buffers)
      if (buf) buf += begin;
    blk.n = end - begin;
    update(*it.group, it.step, blk);
  });
}

void Optimizer::zero_grad() {
  for (const ParamGroup& g : groups_)
    for (const auto& p : g.params) p.second.zero_grad();
}

void Optimizer::set_lr(float lr) {
  TAPEFORMER_CHECK(std::isfinite(lr) && lr >= 0, name_, ": lr must be finite and >= 0, got ", lr);
  for (ParamGroup& g : groups_) g.lr = lr;
}

float Optimizer::lr() const { return groups_.front().lr; }

NamedTensors Optimizer::state_tensors() const {
  NamedTensors out;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      const std::string& pname = groups_[gi].params[pi].first;
      const ParamState& s = state_[gi][pi];
      TAPEFORMER_CHECK(s.step <= kMaxOptimizerSteps, name_, " optimizer state: step of '", pname, "' (", s.step,
                       ") exceeds 2^24, which a float32 step tensor cannot hold");
      out.emplace_back("step." + pname, Tensor::scalar(static_cast<Scalar>(s.step)));
      for (size_t b = 0; b < buffer_names_.size(); ++b) out.emplace_back(buffer_names_[b] + "." + pname, s.buffers[b]);
    }
  }
  return out;
}

void Optimizer::load_state(const NamedTensors& state, int64_t step_count) {
  const std::string what = name_ + " optimizer state: ";
  TAPEFORMER_CHECK(step_count >= 0, what, "step count must be >= 0, got ", step_count);
  std::map<std::string, const Tensor*> given;
  for (const auto& [key, t] : state) {
    TAPEFORMER_CHECK(given.emplace(key, &t).second, what, "duplicate '", key, "'");
    TAPEFORMER_CHECK(t.defined(), what, "'", key, "' is undefined");
  }
  auto find = [&](const std::string& key, const Shape& shape) {
    auto it = given.find(key);
    TAPEFORMER_CHECK(it != given.end(), what, "missing '", key, "' (shape ", shape, ")");
    TAPEFORMER_CHECK(it->second->shape() == shape, what, "'", key, "' has shape ", it->second->shape(),
                     " vs parameter ", shape);
    return it->second;
  };
  std::set<std::string> expected;
  std::vector<std::vector<int64_t>> steps(groups_.size());
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (const auto& [pname, p] : groups_[gi].params) {
      const std::string key = "step." + pname;
      expected.insert(key);
      const Scalar v = find(key, Shape{})->item();
      TAPEFORMER_CHECK(v >= 0 && v == std::floor(v) && v <= static_cast<Scalar>(step_count), what, "'", key,
                       "' must be a whole number in [0, step count ", step_count, "], got ", v);
      steps[gi].push_back(static_cast<int64_t>(v));
      for (const std::string& b : buffer_names_) {
        expected.insert(b + "." + pname);
        find(b + "." + pname, p.shape());
      }
    }
  }
  for (const auto& [key, t] : state)
    TAPEFORMER_CHECK(expected.count(key), what, "unexpected '", key, "' (shape ", t.shape(),
                     "; saved by another optimizer or model?)");
  // Everything is valid: copy.
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (size_t pi = 0; pi < groups_[gi].params.size(); ++pi) {
      ParamState& s = state_[gi][pi];
      s.step = steps[gi][pi];
      for (size_t b = 0; b < buffer_names_.size(); ++b)
        s.buffers[b].copy_from(*given.at(buffer_names_[b] + "." + groups_[gi].params[pi].first));
    }
  }
  steps_ = step_count;
}

}  // namespace tapeformer
