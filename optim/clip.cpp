#include "optim/clip.h"

#include <cmath>

#include "core/eigen.h"
#include "core/error.h"
#include "core/parallel.h"

namespace tapeformer {
namespace {

// Sum of squares over blocks with fixed boundaries, added in block order: the
// result does not depend on how many threads computed the blocks.
constexpr int64_t kBlock = 1 << 14;

double sum_of_squares(const Scalar* g, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  parallel::parallel_for(blocks, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t k = b0; k < b1; ++k) {
      const int64_t off = k * kBlock, len = std::min(kBlock, n - off);
      partial[static_cast<size_t>(k)] = eigen::array(g + off, len).cast<double>().square().sum();
    }
  });
  double sum = 0;
  for (double s : partial) sum += s;
  return sum;
}

}  // namespace

float clip_grad_norm(const std::vector<Var>& params, float max_norm) {
  TAPEFORMER_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0 (or +inf), got ", max_norm);
  double sq = 0;
  for (const Var& p : params) {
    TAPEFORMER_CHECK(p.defined(), "clip_grad_norm: undefined parameter in the list");
    if (!p.has_grad()) continue;
    const Tensor g = p.grad().contiguous();
    sq += sum_of_squares(g.data(), g.numel());
  }
  const auto norm = static_cast<float>(std::sqrt(sq));
  if (!std::isfinite(norm)) return norm;
  const float coef = max_norm / (norm + 1e-6f);
  if (!(coef < 1.0f)) return norm;  // PyTorch clamps coef to 1: a no-op multiply
  for (const Var& p : params) {
    if (!p.has_grad()) continue;
    Tensor& g = p.node()->grad;
    if (!g.is_contiguous()) g = g.contiguous();
    Scalar* data = g.data();
    parallel::parallel_for(g.numel(), kBlock, [&](int64_t b, int64_t e) { eigen::array(data + b, e - b) *= coef; });
  }
  return norm;
}

}  // namespace tapeformer
