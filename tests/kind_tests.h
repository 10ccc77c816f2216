// Helpers of the attention kinds' own tests (tests/layers/test_<kind>.cpp):
// inputs drawn from a seed, the PyTorch reference files of
// tests/fixtures/make_kinds_golden.py, and the largest difference of two tensors.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "golden.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/layers/attention/attention.h"

namespace {  // per test file, as golden.h's helpers
namespace kind_tests {

using namespace tapeformer;

// A reference file of make_kinds_golden.py, loaded (GoldenError when missing).
inline Golden reference(const std::string& name) {
  return load_golden_file(std::string(TAPEFORMER_FIXTURE_DIR) + "/golden_" + name + ".txt");
}

// N(0, scale^2) values from `seed`.
inline Tensor normal(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  Tensor t = Tensor::empty(shape);
  rng.fill_normal(t, 0.0f, scale);
  return t;
}

// Values in [lo, hi) from `seed`.
inline Tensor uniform(const Shape& shape, uint64_t seed, float lo, float hi) {
  Rng rng(seed);
  Tensor t = Tensor::empty(shape);
  rng.fill_uniform(t, lo, hi);
  return t;
}

// A training forward of `layer` over x (B, T, C) with dropout stream `seed`,
// backpropagated from the outputs at positions <= i only: the summed |dx| of
// the inputs after i and of those up to i. A kind whose outputs read no later
// position has later == 0 exactly (and earlier > 0).
struct GradientSplit {
  double later = 0, earlier = 0;
};
inline GradientSplit gradient_around(const Attention& layer, const Tensor& x_value, int64_t i, uint64_t seed) {
  Var x(x_value.clone(), true);
  TapeScope tape;
  Rng rng(seed);
  const Var y = layer.forward(x, rng);  // (B, T, C)
  const int64_t B = y.dim(0), T = y.dim(1), C = y.dim(2);
  Tensor upstream = Tensor::zeros(y.value().shape());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t <= i; ++t)
      for (int64_t c = 0; c < C; ++c) upstream.at({b, t, c}) = 1.0f + 0.1f * static_cast<Scalar>(c);
  backward(y, upstream);
  GradientSplit g;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < x.dim(2); ++c) (t > i ? g.later : g.earlier) += std::abs(x.grad().at({b, t, c}));
  return g;
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  const std::vector<Scalar> x = a.contiguous().to_vector(), y = b.contiguous().to_vector();
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(x[i]) - y[i]));
  return worst;
}

}  // namespace kind_tests
}  // namespace
