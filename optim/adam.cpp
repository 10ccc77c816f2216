// Adam and AdamW update rules (torch.optim.Adam / AdamW, single-tensor path).
#include <cmath>

#include "core/eigen.h"
#include "core/error.h"
#include "optim/optimizer.h"

namespace tapeformer {

Adam::Adam(std::vector<ParamGroup> groups, float beta1, float beta2, float eps)
    : Adam("Adam", /*decoupled=*/false, std::move(groups), beta1, beta2, eps) {}

Adam::Adam(std::string name, bool decoupled, std::vector<ParamGroup> groups, float beta1, float beta2, float eps)
    : Optimizer(name, std::move(groups), {"exp_avg", "exp_avg_sq"}),
      beta1_(beta1), beta2_(beta2), eps_(eps), decoupled_(decoupled) {
  TAPEFORMER_CHECK(beta1 >= 0 && beta1 < 1, name, ": beta1 must be in [0, 1), got ", beta1);
  TAPEFORMER_CHECK(beta2 >= 0 && beta2 < 1, name, ": beta2 must be in [0, 1), got ", beta2);
  TAPEFORMER_CHECK(std::isfinite(eps) && eps > 0, name, ": eps must be finite and > 0, got ", eps);
}

AdamW::AdamW(std::vector<ParamGroup> groups, float beta1, float beta2, float eps)
    : Adam("AdamW", /*decoupled=*/true, std::move(groups), beta1, beta2, eps) {}

void Adam::update(const ParamGroup& group, int64_t step, const Block& blk) const {
  auto p = eigen::array(blk.param, blk.n);
  const auto g = eigen::array(blk.grad, blk.n) * blk.grad_scale;  // the clipped gradient
  auto m = eigen::array(blk.buffers[0], blk.n);  // exp_avg
  auto v = eigen::array(blk.buffers[1], blk.n);  // exp_avg_sq
  // Scalars in double, then rounded once to float, as PyTorch does with its
  // Python-float hyperparameters.
  const double t = static_cast<double>(step), lr = group.lr;
  const auto step_size = static_cast<Scalar>(lr / (1 - std::pow(static_cast<double>(beta1_), t)));
  const auto bc2_sqrt = static_cast<Scalar>(std::sqrt(1 - std::pow(static_cast<double>(beta2_), t)));
  const Scalar b1 = beta1_, b2 = beta2_, wd = group.weight_decay;
  if (decoupled_) {
    p *= static_cast<Scalar>(1 - lr * group.weight_decay);
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;  // addcmul order: ((1-b2) g) g
  } else {
    // d = g + wd p, re-evaluated (p is not written until the last line).
    const auto d = g + wd * p;
    m = b1 * m + (1 - b1) * d;
    v = b2 * v + (1 - b2) * d * d;
  }
  // addcdiv: p + (-step_size m) / denom, denom = sqrt(v) / sqrt(1 - b2^t) + eps.
  p -= step_size * m / (v.sqrt() / bc2_sqrt + eps_);
}

}  // namespace tapeformer
