// Adam and AdamW update rules (torch.optim.Adam / AdamW, single-tensor path).
#include <algorithm>
#include <cmath>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/error.h"
#include "tapeformer/optim/optimizer.h"

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
  // One packet loop over the block: each element's p, g, m and v are read
  // once (four Eigen expressions read the block four times). The arithmetic
  // is the same, operation for operation, as torch's single-tensor path.
  using namespace Eigen::internal;
  using eigen::Packet;
  constexpr int64_t L = eigen::kPacketSize;
  // Scalars in double, then rounded once to float, as PyTorch does with its
  // Python-float hyperparameters.
  const double t = static_cast<double>(step), lr = group.lr;
  const auto step_size = static_cast<Scalar>(lr / (1 - std::pow(static_cast<double>(beta1_), t)));
  const auto bc2_sqrt = static_cast<Scalar>(std::sqrt(1 - std::pow(static_cast<double>(beta2_), t)));
  const Packet b1 = pset1<Packet>(beta1_), b2 = pset1<Packet>(beta2_);
  const Packet one_b1 = pset1<Packet>(1 - beta1_), one_b2 = pset1<Packet>(1 - beta2_);
  const Packet wd = pset1<Packet>(group.weight_decay), scale = pset1<Packet>(blk.grad_scale);
  const Packet decay = pset1<Packet>(static_cast<Scalar>(1 - lr * group.weight_decay));
  const Packet psteps = pset1<Packet>(step_size), pbc2 = pset1<Packet>(bc2_sqrt), peps = pset1<Packet>(eps_);
  Scalar* pp = blk.param;
  Scalar* mp = blk.buffers[0];  // exp_avg
  Scalar* vp = blk.buffers[1];  // exp_avg_sq
  for (int64_t i = 0; i < blk.n; i += L) {
    const int64_t n = std::min(L, blk.n - i);
    Packet p = eigen::load_upto(pp + i, n), m = eigen::load_upto(mp + i, n), v = eigen::load_upto(vp + i, n);
    Packet d = pmul(eigen::load_upto(blk.grad + i, n), scale);  // the clipped gradient
    if (decoupled_) {
      p = pmul(p, decay);
    } else {
      d = padd(d, pmul(wd, p));  // + wd p (p is not written until the end)
    }
    m = padd(pmul(b1, m), pmul(one_b1, d));
    v = padd(pmul(b2, v), pmul(pmul(one_b2, d), d));  // addcmul order: ((1-b2) d) d
    // addcdiv: p + (-step_size m) / denom, denom = sqrt(v) / sqrt(1 - b2^t) + eps.
    p = psub(p, pdiv(pmul(psteps, m), padd(pdiv(psqrt(v), pbc2), peps)));
    eigen::store_upto(pp + i, p, n);
    eigen::store_upto(mp + i, m, n);
    eigen::store_upto(vp + i, v, n);
  }
}

}  // namespace tapeformer
