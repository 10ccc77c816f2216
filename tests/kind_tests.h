// Helpers of the attention kinds' own tests (tests/layers/test_<kind>.cpp):
// inputs drawn from a seed, the PyTorch reference files of
// tests/fixtures/make_kinds_golden.py, and the largest difference of two tensors.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "golden.h"
#include "tapeformer/core/rng.h"

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

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  const std::vector<Scalar> x = a.contiguous().to_vector(), y = b.contiguous().to_vector();
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(x[i]) - y[i]));
  return worst;
}

}  // namespace kind_tests
}  // namespace
