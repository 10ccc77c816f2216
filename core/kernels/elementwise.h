// Elementwise kernels: chunked, parallel loops over contiguous arrays.
//
//   Tensor y = kernels::map(x, [](const Scalar* x, Scalar* y, int64_t n) {
//     eigen::array(y, n) = eigen::array(x, n) * 2.0f;
//   });
//
// The functor receives raw chunks so that Eigen vectorises the body; inputs
// are made contiguous first, the output is a fresh contiguous tensor. Eigen's
// maps are for exact arithmetic (+ - * /, sqrt, min, max): its functions
// (exp, tanh, ...) and reductions take other paths for a chunk's unaligned
// ends and other lane orders on other CPUs, so those go through vec's loops
// (vector_loops.h: vec::map with eigen::exp, vec::sum, ...).
#pragma once

#include <utility>

#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/tensor.h"
#include "tapeformer/core/profile.h"

namespace tapeformer::kernels {

inline constexpr int64_t kElementwiseGrain = 1 << 15;

// out = f(x) chunk by chunk: f(const Scalar* x, Scalar* out, int64_t n).
template <class F>
Tensor map(const Tensor& x_in, F&& f) {
  const profile::Scope timed("elementwise");
  const Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape());
  const Scalar* xp = x.data();
  Scalar* op = out.data();
  parallel::parallel_for(x.numel(), kElementwiseGrain,
                         [&](int64_t b, int64_t e) { f(xp + b, op + b, e - b); });
  return out;
}

// out = f(a, b) for same-shape inputs: f(const Scalar* a, const Scalar* b, Scalar* out, int64_t n).
template <class F>
Tensor map2(const Tensor& a_in, const Tensor& b_in, F&& f) {
  const profile::Scope timed("elementwise");
  TAPEFORMER_CHECK(a_in.shape() == b_in.shape(), "map2: shapes differ: ", a_in.shape(), " vs ",
                   b_in.shape());
  const Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor out = Tensor::empty(a.shape());
  const Scalar* ap = a.data();
  const Scalar* bp = b.data();
  Scalar* op = out.data();
  parallel::parallel_for(a.numel(), kElementwiseGrain,
                         [&](int64_t s, int64_t e) { f(ap + s, bp + s, op + s, e - s); });
  return out;
}

// out = f(a, b, c) for same-shape inputs.
template <class F>
Tensor map3(const Tensor& a_in, const Tensor& b_in, const Tensor& c_in, F&& f) {
  const profile::Scope timed("elementwise");
  TAPEFORMER_CHECK(a_in.shape() == b_in.shape() && a_in.shape() == c_in.shape(),
                   "map3: shapes differ: ", a_in.shape(), ", ", b_in.shape(), ", ", c_in.shape());
  const Tensor a = a_in.contiguous(), b = b_in.contiguous(), c = c_in.contiguous();
  Tensor out = Tensor::empty(a.shape());
  const Scalar* ap = a.data();
  const Scalar* bp = b.data();
  const Scalar* cp = c.data();
  Scalar* op = out.data();
  parallel::parallel_for(a.numel(), kElementwiseGrain,
                         [&](int64_t s, int64_t e) { f(ap + s, bp + s, cp + s, op + s, e - s); });
  return out;
}

// acc += x, in place (acc contiguous, same shape).
void add_inplace(Tensor& acc, const Tensor& x);

}  // namespace tapeformer::kernels
