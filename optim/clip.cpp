#include "optim/clip.h"

#include <cmath>

#include "core/eigen.h"
#include "core/error.h"

namespace tapeformer {

float clip_grad_norm(const std::vector<Var>& params, float max_norm) {
  TAPEFORMER_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  double sq = 0;  // in double, in parameter order: deterministic
  for (const Var& p : params) {
    if (!p.has_grad()) continue;
    const Tensor g = p.grad().contiguous();
    sq += eigen::array(g.data(), g.numel()).cast<double>().square().sum();
  }
  const auto norm = static_cast<float>(std::sqrt(sq));
  if (std::isfinite(norm) && norm > max_norm) {
    const float scale = max_norm / (norm + 1e-6f);
    for (const Var& p : params) {
      if (!p.has_grad()) continue;
      Tensor& g = p.node()->grad;
      if (!g.is_contiguous()) g = g.contiguous();
      eigen::array(g.data(), g.numel()) *= scale;
    }
  }
  return norm;
}

}  // namespace tapeformer
