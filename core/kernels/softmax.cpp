#include "core/kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/eigen.h"
#include "core/parallel.h"

namespace tapeformer::kernels {
namespace {
constexpr int64_t kRowGrainElems = 1 << 14;
int64_t row_grain(int64_t n) { return std::max<int64_t>(1, kRowGrainElems / std::max<int64_t>(n, 1)); }
}  // namespace

void softmax_rows(const Scalar* x, Scalar* y, int64_t rows, int64_t n) {
  parallel::parallel_for(rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      auto xr = eigen::array(x + r * n, n);
      auto yr = eigen::array(y + r * n, n);
      // Subtracting the row max keeps exp finite; -inf entries become 0.
      yr = (xr - xr.maxCoeff()).exp();
      yr /= yr.sum();
    }
  });
}

void softmax_backward_rows(const Scalar* y, const Scalar* dy, Scalar* dx, int64_t rows,
                           int64_t n) {
  parallel::parallel_for(rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      auto yr = eigen::array(y + r * n, n);
      auto dyr = eigen::array(dy + r * n, n);
      const Scalar dot = (yr * dyr).sum();
      eigen::array(dx + r * n, n) = yr * (dyr - dot);
    }
  });
}

void log_softmax_rows(const Scalar* x, Scalar* y, int64_t rows, int64_t n) {
  parallel::parallel_for(rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      auto xr = eigen::array(x + r * n, n);
      const Scalar m = xr.maxCoeff();
      const Scalar lse = m + std::log((xr - m).exp().sum());
      eigen::array(y + r * n, n) = xr - lse;
    }
  });
}

void log_softmax_backward_rows(const Scalar* y, const Scalar* dy, Scalar* dx, int64_t rows,
                               int64_t n) {
  parallel::parallel_for(rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      auto dyr = eigen::array(dy + r * n, n);
      eigen::array(dx + r * n, n) = dyr - eigen::array(y + r * n, n).exp() * dyr.sum();
    }
  });
}

double cross_entropy_rows(const Scalar* logits, const int32_t* targets, Scalar* lse, int64_t rows,
                          int64_t V, int32_t ignore_index, int64_t* counted) {
  // Per-row losses first, then one ordered sum: deterministic for any thread count.
  std::vector<double> nll(static_cast<size_t>(rows), 0.0);
  parallel::parallel_for(rows, row_grain(V), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      auto zr = eigen::array(logits + r * V, V);
      const Scalar m = zr.maxCoeff();
      lse[r] = m + std::log((zr - m).exp().sum());
      if (targets[r] != ignore_index) nll[r] = static_cast<double>(lse[r]) - zr(targets[r]);
    }
  });
  double total = 0.0;
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == ignore_index) continue;
    total += nll[r];
    ++n;
  }
  *counted = n;
  return total;
}

void cross_entropy_backward_rows(const Scalar* logits, const int32_t* targets, const Scalar* lse,
                                 Scalar scale, Scalar* dlogits, int64_t rows, int64_t V,
                                 int32_t ignore_index) {
  parallel::parallel_for(rows, row_grain(V), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      auto dr = eigen::array(dlogits + r * V, V);
      if (targets[r] == ignore_index) {
        dr.setZero();
        continue;
      }
      dr = (eigen::array(logits + r * V, V) - lse[r]).exp() * scale;
      dr(targets[r]) -= scale;
    }
  });
}

}  // namespace tapeformer::kernels
