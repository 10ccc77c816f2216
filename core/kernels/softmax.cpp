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
      const eigen::Packet m = pset1<eigen::Packet>(vec::max(xr, n));
      vec::packets(n, [&](int64_t i, int64_t l) { vec::store_upto(yr + i, eigen::exp(psub(vec::load_upto(xr + i, l), m)), l); });
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
      const Scalar* xr = x + r * n;
      const Scalar m = vec::max(xr, n);
      const Scalar lse = m + std::log(vec::sum_exp(xr, m, n));
      eigen::array(y + r * n, n) = eigen::array(xr, n) - lse;
    }
  });
}

void log_softmax_backward_rows(const Scalar* y, const Scalar* dy, Scalar* dx, int64_t rows,
                               int64_t n) {
  const profile::Scope timed("softmax");
  parallel::parallel_for(rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      // dx = dy - e^y sum(dy)
      const Scalar* dyr = dy + r * n;
      const Scalar* yr = y + r * n;
      const eigen::Packet total = Eigen::internal::pset1<eigen::Packet>(vec::sum(dyr, n));
      vec::packets(n, [&](int64_t i, int64_t l) {
        using namespace Eigen::internal;
        vec::store_upto(dx + r * n + i, psub(vec::load_upto(dyr + i, l), pmul(eigen::exp(vec::load_upto(yr + i, l)), total)), l);
      });
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
      const Scalar* zr = logits + r * V;
      const Scalar m = vec::max(zr, V);
      lse[r] = m + std::log(vec::sum_exp(zr, m, V));
      if (targets[r] != ignore_index) nll[r] = static_cast<double>(lse[r]) - zr[targets[r]];
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
      // softmax(z) scale = e^(z - lse) scale
      const eigen::Packet l = Eigen::internal::pset1<eigen::Packet>(lse[r]), s = Eigen::internal::pset1<eigen::Packet>(scale);
      vec::packets(V, [&](int64_t i, int64_t n) {
        using namespace Eigen::internal;
        vec::store_upto(dlogits + r * V + i, pmul(eigen::exp(psub(vec::load_upto(logits + r * V + i, n), l)), s), n);
      });
      dr(targets[r]) -= scale;
    }
  });
}

}  // namespace tapeformer::kernels
