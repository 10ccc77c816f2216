// SGD update rule (torch.optim.SGD, single-tensor path).
#include <cmath>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/error.h"
#include "tapeformer/optim/optimizer.h"

namespace tapeformer {

SGD::SGD(std::vector<ParamGroup> groups, float momentum, float dampening, bool nesterov)
    : Optimizer("SGD", std::move(groups),
                momentum > 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{}),
      momentum_(momentum), dampening_(dampening), nesterov_(nesterov) {
  TAPEFORMER_CHECK(std::isfinite(momentum) && momentum >= 0, "SGD: momentum must be finite and >= 0, got ",
                   momentum);
  TAPEFORMER_CHECK(std::isfinite(dampening), "SGD: dampening must be finite, got ", dampening);
  TAPEFORMER_CHECK(!nesterov || (momentum > 0 && dampening == 0),
                   "SGD: nesterov requires momentum > 0 and dampening 0, got momentum ", momentum, ", dampening ",
                   dampening);
}

void SGD::update(const ParamGroup& group, int64_t step, const Block& blk) const {
  auto p = eigen::array(blk.param, blk.n);
  const auto g = eigen::array(blk.grad, blk.n) * blk.grad_scale;  // the clipped gradient
  const Scalar lr = group.lr, wd = group.weight_decay, mu = momentum_;
  // d = g + wd p, kept as an expression: it is read before p is written, so
  // re-evaluating it gives the same value without a temporary. (PyTorch skips
  // the add when wd == 0; g + 0 * p == g for every finite p.)
  const auto d = g + wd * p;
  if (momentum_ == 0) {
    p -= lr * d;
    return;
  }
  auto buf = eigen::array(blk.buffers[0], blk.n);
  if (step == 1) buf = d;  // PyTorch: buf = clone(d) on the parameter's first update
  else buf = mu * buf + (1 - dampening_) * d;
  if (nesterov_) p -= lr * (d + mu * buf);
  else p -= lr * buf;
}

}  // namespace tapeformer
