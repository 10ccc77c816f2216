#include "optim/optimizer.h"

#include <cmath>
#include <map>

#include "core/eigen.h"
#include "core/error.h"
#include "core/parallel.h"

namespace tapeformer {

std::vector<ParamGroup> decay_groups(const NamedVars& params, float lr, float weight_decay) {
  ParamGroup decay{{}, lr, weight_decay}, no_decay{{}, lr, 0.0f};
  for (const auto& p : params) (p.second.rank() >= 2 ? decay : no_decay).params.push_back(p);
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, std::vector<std::string> buffers, const char* name)
    : name_(name), groups_(std::move(groups)), buffer_names_(std::move(buffers)) {
  for (const ParamGroup& g : groups_) {
    TAPEFORMER_CHECK(g.lr >= 0, name_, ": lr must be >= 0, got ", g.lr);
    TAPEFORMER_CHECK(g.weight_decay >= 0, name_, ": weight_decay must be >= 0, got ", g.weight_decay);
    auto& gs = state_.emplace_back();
    for (const auto& [pname, p] : g.params) {
      TAPEFORMER_CHECK(p.value().is_contiguous(), name_, ": parameter '", pname, "' must be contiguous");
      auto& ps = gs.emplace_back();
      for (size_t b = 0; b < buffer_names_.size(); ++b) ps.push_back(Tensor::zeros(p.shape()));
    }
  }
}

void Optimizer::step() {
  ++steps_;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    for (size_t pi = 0; pi < g.params.size(); ++pi) {
      Var p = g.params[pi].second;
      if (!p.has_grad()) continue;
      const Tensor grad = p.grad().contiguous();
      std::vector<Tensor>& bufs = state_[gi][pi];
      Scalar* pp = p.value().data();
      const Scalar* gp = grad.data();
      parallel::parallel_for(p.numel(), 1 << 14, [&](int64_t b, int64_t e) {
        std::vector<Scalar*> st;
        for (Tensor& t : bufs) st.push_back(t.data() + b);
        update(g, pp + b, gp + b, st, e - b);
      });
    }
  }
}

void Optimizer::zero_grad() {
  for (const ParamGroup& g : groups_)
    for (const auto& p : g.params) p.second.zero_grad();
}

void Optimizer::set_lr(float lr) {
  TAPEFORMER_CHECK(lr >= 0 && std::isfinite(lr), name_, ": lr must be finite and >= 0, got ", lr);
  for (ParamGroup& g : groups_) g.lr = lr;
}

float Optimizer::lr() const { return groups_.empty() ? 0.0f : groups_[0].lr; }

NamedTensors Optimizer::state_tensors() const {
  NamedTensors out;
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t pi = 0; pi < groups_[gi].params.size(); ++pi)
      for (size_t b = 0; b < buffer_names_.size(); ++b)
        out.emplace_back(buffer_names_[b] + "." + groups_[gi].params[pi].first, state_[gi][pi][b]);
  return out;
}

void Optimizer::load_state(const NamedTensors& state, int64_t step_count) {
  TAPEFORMER_CHECK(step_count >= 0, name_, " state: negative step count ", step_count);
  std::map<std::string, const Tensor*> given;
  for (const auto& [k, t] : state) given[k] = &t;
  NamedTensors mine = state_tensors();
  TAPEFORMER_CHECK(given.size() == mine.size(), name_, " state: ", given.size(), " tensors, expected ",
                   mine.size(), " (was it saved by another optimizer?)");
  for (auto& [k, dst] : mine) {
    auto it = given.find(k);
    TAPEFORMER_CHECK(it != given.end(), name_, " state: missing '", k, "'");
    TAPEFORMER_CHECK(it->second->shape() == dst.shape(), name_, " state: '", k, "' has shape ",
                     it->second->shape(), " but the parameter is ", dst.shape());
  }
  for (auto& [k, dst] : mine) dst.copy_from(*given[k]);
  steps_ = step_count;
}

SGD::SGD(std::vector<ParamGroup> groups, float momentum, float dampening, bool nesterov)
    : Optimizer(std::move(groups), momentum > 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{},
                "SGD"),
      momentum_(momentum), dampening_(dampening), nesterov_(nesterov) {
  TAPEFORMER_CHECK(momentum >= 0, "SGD: momentum must be >= 0, got ", momentum);
  TAPEFORMER_CHECK(!nesterov || (momentum > 0 && dampening == 0),
                   "SGD: nesterov needs momentum > 0 and dampening 0, got momentum ", momentum, ", dampening ",
                   dampening);
}

void SGD::update(const ParamGroup& g, Scalar* p, const Scalar* grad, std::vector<Scalar*>& st, int64_t n) {
  auto P = eigen::array(p, n);
  eigen::Array d = eigen::array(grad, n) + g.weight_decay * P;
  if (momentum_ > 0) {
    auto buf = eigen::array(st[0], n);
    if (step_count() == 1) buf = d;
    else buf = momentum_ * buf + (1 - dampening_) * d;
    if (nesterov_) d += momentum_ * buf;
    else d = buf;
  }
  P -= g.lr * d;
}

Adam::Adam(std::vector<ParamGroup> groups, float beta1, float beta2, float eps)
    : Adam(std::move(groups), beta1, beta2, eps, false, "Adam") {}

Adam::Adam(std::vector<ParamGroup> groups, float beta1, float beta2, float eps, bool decoupled, const char* name)
    : Optimizer(std::move(groups), {"exp_avg", "exp_avg_sq"}, name), beta1_(beta1), beta2_(beta2), eps_(eps),
      decoupled_(decoupled) {
  TAPEFORMER_CHECK(beta1 >= 0 && beta1 < 1, name, ": beta1 must be in [0, 1), got ", beta1);
  TAPEFORMER_CHECK(beta2 >= 0 && beta2 < 1, name, ": beta2 must be in [0, 1), got ", beta2);
  TAPEFORMER_CHECK(eps > 0, name, ": eps must be > 0, got ", eps);
}

void Adam::update(const ParamGroup& g, Scalar* p, const Scalar* grad, std::vector<Scalar*>& st, int64_t n) {
  auto P = eigen::array(p, n);
  auto m = eigen::array(st[0], n);
  auto v = eigen::array(st[1], n);
  const double t = static_cast<double>(step_count());
  const auto bc1 = static_cast<Scalar>(1 - std::pow(static_cast<double>(beta1_), t));
  const auto bc2_sqrt = static_cast<Scalar>(std::sqrt(1 - std::pow(static_cast<double>(beta2_), t)));
  const Scalar step_size = g.lr / bc1;
  if (decoupled_) {
    P *= 1 - g.lr * g.weight_decay;
    auto G = eigen::array(grad, n);
    m = beta1_ * m + (1 - beta1_) * G;
    v = beta2_ * v + (1 - beta2_) * G.square();
  } else {
    const eigen::Array G = eigen::array(grad, n) + g.weight_decay * P;
    m = beta1_ * m + (1 - beta1_) * G;
    v = beta2_ * v + (1 - beta2_) * G.square();
  }
  P -= step_size * m / (v.sqrt() / bc2_sqrt + eps_);
}

AdamW::AdamW(std::vector<ParamGroup> groups, float beta1, float beta2, float eps)
    : Adam(std::move(groups), beta1, beta2, eps, true, "AdamW") {}

}  // namespace tapeformer
