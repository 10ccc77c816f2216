#include "tapeformer/optim/clip.h"

#include <cmath>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/vector_loops.h"
#include "tapeformer/core/parallel.h"

namespace tapeformer {
namespace {

// The parameters' gradients (contiguous), skipping parameters without one.
std::vector<Tensor> gradients(const std::vector<Var>& params, const char* who) {
  std::vector<Tensor> grads;
  for (const Var& p : params) {
    TAPEFORMER_CHECK(p.defined(), who, ": undefined parameter in the list");
    if (p.has_grad()) grads.push_back(p.dense_grad());
  }
  return grads;
}

std::vector<int64_t> sizes_of(const std::vector<Tensor>& ts) {
  std::vector<int64_t> sizes;
  for (const Tensor& t : ts) sizes.push_back(t.numel());
  return sizes;
}

}  // namespace

float grad_norm(const std::vector<Var>& params) {
  const std::vector<Tensor> grads = gradients(params, "grad_norm");
  const std::vector<int64_t> sizes = sizes_of(grads);
  // Block k of gradient i lands in partial[first[i] + k]: summed in order below.
  std::vector<size_t> first(grads.size() + 1, 0);
  for (size_t i = 0; i < grads.size(); ++i)
    first[i + 1] = first[i] + static_cast<size_t>((sizes[i] + kNormBlock - 1) / kNormBlock);
  std::vector<double> partial(first.back(), 0.0);
  parallel::for_each_block(sizes, kNormBlock, [&](size_t i, int64_t b, int64_t e) {
    const Scalar* g = grads[i].data() + b;
    // float, in vec's lane order (the same bits on every instruction set):
    // converting every element to double made this pass 10x slower.
    double sq = kernels::vec::sum_squares(g, e - b);
    // A float square overflows at |g| ~ 1.8e19, exactly the exploding
    // gradient clipping must still scale down: such a block is redone in double.
    if (!std::isfinite(sq)) {
      sq = 0.0;
      for (int64_t j = 0; j < e - b; ++j) sq += static_cast<double>(g[j]) * g[j];
    }
    partial[first[i] + static_cast<size_t>(b / kNormBlock)] = sq;
  });
  double sum = 0;
  for (double s : partial) sum += s;
  return static_cast<float>(std::sqrt(sum));
}

float clip_coefficient(float norm, float max_norm) {
  TAPEFORMER_CHECK(max_norm > 0, "clip_coefficient: max_norm must be > 0 (or +inf), got ", max_norm);
  if (!std::isfinite(norm)) return 1.0f;
  const float coef = max_norm / (norm + 1e-6f);
  return coef < 1.0f ? coef : 1.0f;  // PyTorch clamps coef to 1: a no-op multiply
}

float clip_grad_norm(const std::vector<Var>& params, float max_norm) {
  TAPEFORMER_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0 (or +inf), got ", max_norm);
  const float norm = grad_norm(params);
  const float coef = clip_coefficient(norm, max_norm);
  if (coef == 1.0f) return norm;
  std::vector<Tensor> grads = gradients(params, "clip_grad_norm");  // handles on the live gradients
  parallel::for_each_block(sizes_of(grads), kNormBlock, [&](size_t i, int64_t b, int64_t e) {
    eigen::array(grads[i].data() + b, e - b) *= coef;
  });
  return norm;
}

}  // namespace tapeformer
