#include "tapeformer/core/kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/kernels/vector_loops.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/profile.h"

namespace tapeformer::kernels {
namespace {
constexpr int64_t kRowGrainElems = 1 << 14;
int64_t row_grain(int64_t n) { return std::max<int64_t>(1, kRowGrainElems / std::max<int64_t>(n, 1)); }
}  // namespace

// Rows run through vec's packet loops (Eigen's packet exp for every entry,
// sums in one lane order), so a row's bits do not depend on its length past
// its last nonzero entry: a causal row of 5 scores and the same row padded
// with masked (-inf) scores to 8 give the same probabilities. Eigen's array
// expressions take scalar paths for short rows and packet paths for long
// ones, which differ in the last bit.
void softmax_rows(const Scalar* x, Scalar* y, int64_t rows, int64_t n) {
  const profile::Scope timed("softmax");
  using namespace Eigen::internal;
  parallel::parallel_for(rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const Scalar* xr = x + r * n;
      Scalar* yr = y + r * n;
      // Subtracting the row max keeps exp finite; -inf entries become 0.
      const eigen::Packet m = pset1<eigen::Packet>(eigen::array(xr, n).maxCoeff());
      vec::packets(n, [&](int64_t i, int64_t l) { vec::store_upto(yr + i, pexp(psub(vec::load_upto(xr + i, l), m)), l); });
      const eigen::Packet total = pset1<eigen::Packet>(vec::sum(yr, n));
      vec::packets(n, [&](int64_t i, int64_t l) { vec::store_upto(yr + i, pdiv(vec::load_upto(yr + i, l), total), l); });
    }
  });
}

void softmax_backward_rows(const Scalar* y, const Scalar* dy, Scalar* dx, int64_t rows,
                           int64_t n) {
  const profile::Scope timed("softmax");
  using namespace Eigen::internal;
  parallel::parallel_for(rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const Scalar *yr = y + r * n, *dyr = dy + r * n;
      const eigen::Packet dot = pset1<eigen::Packet>(vec::dot(yr, dyr, n));
      vec::packets(n, [&](int64_t i, int64_t l) {
        vec::store_upto(dx + r * n + i, pmul(vec::load_upto(yr + i, l), psub(vec::load_upto(dyr + i, l), dot)), l);
      });
    }
  });
}

void log_softmax_rows(const Scalar* x, Scalar* y, int64_t rows, int64_t n) {
  const profile::Scope timed("softmax");
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
  const profile::Scope timed("softmax");
  parallel::parallel_for(rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      auto dyr = eigen::array(dy + r * n, n);
      eigen::array(dx + r * n, n) = dyr - eigen::array(y + r * n, n).exp() * dyr.sum();
    }
  });
}

double cross_entropy_rows(const Scalar* logits, const int32_t* targets, Scalar* lse, int64_t rows,
                          int64_t V, int32_t ignore_index, int64_t* counted) {
  const profile::Scope timed("cross_entropy");
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
  const profile::Scope timed("cross_entropy");
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
