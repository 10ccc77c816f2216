// Reductions: sum, mean, max over axes; cumsum.
#include <algorithm>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/reduce.h"

namespace tapeformer {
namespace {

// Normalised, sorted, duplicate-free axes.
std::vector<int> normalize_axes(const std::vector<int>& axes, const Shape& shape, const char* op) {
  std::vector<int> out;
  for (int a : axes) out.push_back(normalize_axis(a, shape, op));
  std::sort(out.begin(), out.end());
  TAPEFORMER_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), op,
                   ": repeated axis for input ", shape);
  return out;
}

// Shape with the reduced axes kept (as 1) or dropped.
Shape reduced_shape(const Shape& shape, const std::vector<int>& axes, bool keepdim) {
  Shape out;
  for (int i = 0; i < shape.rank(); ++i) {
    const bool reduced = std::binary_search(axes.begin(), axes.end(), i);
    if (!reduced) out.push_back(shape[i]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

}  // namespace

Var sum(const Var& x, const std::vector<int>& axes_in, bool keepdim) {
  TAPEFORMER_CHECK(x.defined(), "sum: undefined input");
  const std::vector<int> axes = normalize_axes(axes_in, x.shape(), "sum");
  Tensor y = x.value();
  for (int a : axes) y = kernels::sum_axis(y, a);  // keeps dims as 1
  const Shape kept = y.shape();
  Var out = make_result(y.reshape(reduced_shape(x.shape(), axes, keepdim)), {&x});
  record_backward(out, [x, kept](const Tensor& g) {
    accumulate_grad(x, g.reshape(kept).expand(x.shape()).contiguous(), "sum");
  });
  return out;
}

Var sum(const Var& x) {
  std::vector<int> all(x.rank());
  for (int i = 0; i < x.rank(); ++i) all[i] = i;
  return sum(x, all, false);
}

Var mean(const Var& x, const std::vector<int>& axes, bool keepdim) {
  const std::vector<int> norm = normalize_axes(axes, x.shape(), "mean");
  int64_t n = 1;
  for (int a : norm) n *= x.dim(a);
  TAPEFORMER_CHECK(n > 0, "mean: reducing ", x.shape(), " over an empty axis");
  return mul_scalar(sum(x, norm, keepdim), 1.0f / static_cast<Scalar>(n));
}

Var mean(const Var& x) {
  TAPEFORMER_CHECK(x.defined() && x.numel() > 0, "mean: empty input ", x.value());
  return mul_scalar(sum(x), 1.0f / static_cast<Scalar>(x.numel()));
}

Var max(const Var& x, int axis_in, bool keepdim) {
  TAPEFORMER_CHECK(x.defined(), "max: undefined input");
  const int axis = normalize_axis(axis_in, x.shape(), "max");
  auto argmax = std::make_shared<std::vector<int32_t>>();
  Tensor y = kernels::max_axis(x.value(), axis, argmax.get());
  const Shape kept = y.shape();
  Var out = make_result(y.reshape(reduced_shape(x.shape(), {axis}, keepdim)), {&x});
  record_backward(out, [x, kept, axis, argmax](const Tensor& g_in) {
    // Scatter g to the first maximum of each reduced slice: x viewed as [outer, n, inner].
    const Tensor g = g_in.reshape(kept).contiguous();
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis; ++i) outer *= x.dim(i);
    for (int i = axis + 1; i < x.rank(); ++i) inner *= x.dim(i);
    const int64_t n = x.dim(axis);
    Tensor dx = Tensor::zeros(x.shape());
    const Scalar* gp = g.data();
    Scalar* dp = dx.data();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i)
        dp[(o * n + (*argmax)[o * inner + i]) * inner + i] = gp[o * inner + i];
    accumulate_grad(x, dx, "max");
  });
  return out;
}

Var max(const Var& x, const std::vector<int>& axes_in, bool keepdim) {
  TAPEFORMER_CHECK(x.defined(), "max: undefined input");
  const std::vector<int> axes = normalize_axes(axes_in, x.shape(), "max");
  Var y = x;
  // Reduce from the last axis so earlier axis numbers stay valid when dims are dropped.
  for (auto it = axes.rbegin(); it != axes.rend(); ++it) y = max(y, *it, keepdim);
  return y;
}

Var cumsum(const Var& x, int axis_in) {
  TAPEFORMER_CHECK(x.defined(), "cumsum: undefined input");
  const int axis = normalize_axis(axis_in, x.shape(), "cumsum");
  Var out = make_result(kernels::cumsum_axis(x.value(), axis, false), {&x});
  record_backward(out, [x, axis](const Tensor& g) {
    accumulate_grad(x, kernels::cumsum_axis(g, axis, /*reverse=*/true), "cumsum");
  });
  return out;
}

}  // namespace tapeformer
