#include "tapeformer/core/kernels/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/kernels/vector_loops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/profile.h"

namespace tapeformer::kernels {
namespace {

struct Layout {
  int64_t outer = 1, n = 1, inner = 1;
};

Layout layout_of(const Shape& s, int axis) {
  Layout l;
  for (int i = 0; i < axis; ++i) l.outer *= s[i];
  l.n = s[axis];
  for (int i = axis + 1; i < s.rank(); ++i) l.inner *= s[i];
  return l;
}

Shape keep_dim(Shape s, int axis) {
  s[axis] = 1;
  return s;
}

}  // namespace

Tensor sum_axis(const Tensor& x_in, int axis) {
  const profile::Scope timed("reduce");
  const Tensor x = x_in.contiguous();
  const Layout l = layout_of(x.shape(), axis);
  Tensor out = Tensor::zeros(keep_dim(x.shape(), axis));
  const Scalar* xp = x.data();
  Scalar* op = out.data();
  // Accumulate rows of length `inner` in order, so every output element sums
  // its terms in the same order whatever the thread count.
  if (l.outer == 1 && l.inner >= 256) {
    // A column sum (e.g. a bias gradient over B*T rows): split the columns.
    parallel::parallel_for(l.inner, 64, [&](int64_t c0, int64_t c1) {
      auto acc = eigen::array(op + c0, c1 - c0);
      for (int64_t k = 0; k < l.n; ++k) acc += eigen::array(xp + k * l.inner + c0, c1 - c0);
    });
    return out;
  }
  parallel::parallel_for(l.outer, 1, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      auto acc = eigen::array(op + o * l.inner, l.inner);
      if (l.inner == 1) {
        acc(0) = vec::sum(xp + o * l.n, l.n);
        continue;
      }
      for (int64_t k = 0; k < l.n; ++k) acc += eigen::array(xp + (o * l.n + k) * l.inner, l.inner);
    }
  });
  return out;
}

Tensor max_axis(const Tensor& x_in, int axis, std::vector<int32_t>* argmax) {
  const profile::Scope timed("reduce");
  const Tensor x = x_in.contiguous();
  const Layout l = layout_of(x.shape(), axis);
  TAPEFORMER_CHECK(l.n > 0, "max: cannot reduce empty axis ", axis, " of ", x.shape());
  Tensor out = Tensor::empty(keep_dim(x.shape(), axis));
  std::vector<int32_t> idx(static_cast<size_t>(l.outer * l.inner), 0);
  const Scalar* xp = x.data();
  Scalar* op = out.data();
  parallel::parallel_for(l.outer, 1, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t i = 0; i < l.inner; ++i) {
        Scalar best = xp[o * l.n * l.inner + i];
        int32_t bi = 0;
        for (int64_t k = 1; k < l.n; ++k) {
          const Scalar v = xp[(o * l.n + k) * l.inner + i];
          // NaN propagates: a NaN is never replaced.
          if (v > best || (std::isnan(v) && !std::isnan(best))) {
            best = v;
            bi = static_cast<int32_t>(k);
          }
        }
        op[o * l.inner + i] = best;
        idx[o * l.inner + i] = bi;
      }
    }
  });
  if (argmax) *argmax = std::move(idx);
  return out;
}

Tensor cumsum_axis(const Tensor& x_in, int axis, bool reverse) {
  const profile::Scope timed("reduce");
  const Tensor x = x_in.contiguous();
  const Layout l = layout_of(x.shape(), axis);
  Tensor out = Tensor::empty(x.shape());
  const Scalar* xp = x.data();
  Scalar* op = out.data();
  parallel::parallel_for(l.outer, 1, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t step = 0; step < l.n; ++step) {
        const int64_t k = reverse ? l.n - 1 - step : step;
        const int64_t prev = reverse ? k + 1 : k - 1;
        auto dst = eigen::array(op + (o * l.n + k) * l.inner, l.inner);
        auto src = eigen::array(xp + (o * l.n + k) * l.inner, l.inner);
        if (step == 0) {
          dst = src;
        } else {
          dst = src + eigen::array(op + (o * l.n + prev) * l.inner, l.inner);
        }
      }
    }
  });
  return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  const profile::Scope timed("reduce");
  if (g.shape() == shape) return g;
  TAPEFORMER_CHECK(g.rank() >= shape.rank(), "sum_to: cannot sum ", g.shape(), " to ", shape);
  Tensor t = g;
  const int lead = g.rank() - shape.rank();
  // Leading dims that broadcasting added: fold them into one and sum it away.
  if (lead > 0) {
    int64_t n = 1;
    for (int i = 0; i < lead; ++i) n *= g.dim(i);
    std::vector<int64_t> dims{n};
    for (int i = lead; i < g.rank(); ++i) dims.push_back(g.dim(i));
    t = sum_axis(t.reshape(Shape(dims)), 0).squeeze(0);
  }
  for (int i = 0; i < shape.rank(); ++i) {
    if (shape[i] == 1 && t.dim(i) != 1) {
      t = sum_axis(t, i);
    } else {
      TAPEFORMER_CHECK(shape[i] == t.dim(i), "sum_to: cannot sum ", g.shape(), " to ", shape);
    }
  }
  return t;
}

}  // namespace tapeformer::kernels
