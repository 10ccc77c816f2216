#include "tapeformer/core/kernels/norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/kernels/vector_loops.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/profile.h"

namespace tapeformer::kernels {
namespace {
int64_t row_grain(int64_t C) { return std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(C, 1)); }

// Rows per partial sum of a norm's parameter gradients (fixed: the sums must
// not depend on the thread count).
constexpr int64_t kParamRowBlock = 32;

// Parameter gradients sum over rows. Threads split the columns and each sums
// its columns over all rows in order: deterministic for any thread count.
// term(r, c0, n) is row r's contribution to columns [c0, c0 + n).
template <class Term>
void accumulate_rows(Scalar* acc, int64_t rows, int64_t C, Term&& term) {
  if (!acc) return;
  parallel::parallel_for(C, 32, [&](int64_t c0, int64_t c1) {
    auto a = eigen::array(acc + c0, c1 - c0);
    for (int64_t r = 0; r < rows; ++r) a += term(r, c0, c1 - c0);
  });
}
// y = gamma * (x - mu) * rs + beta for one row: the forward and the rebuild
// of its output run this same code, so they give the same bits.
inline void normalise_row(const Scalar* x, const Scalar* gamma, const Scalar* beta, Scalar mu, Scalar rs,
                          Scalar* y, int64_t C) {
  const auto xr = eigen::array(x, C);
  auto yr = eigen::array(y, C);
  // One pass per case: Eigen's setup per expression is a large part of
  // the cost on rows of a few hundred elements.
  if (gamma && beta) {
    yr = (xr - mu) * rs * eigen::array(gamma, C) + eigen::array(beta, C);
  } else if (gamma) {
    yr = (xr - mu) * rs * eigen::array(gamma, C);
  } else {
    yr = (xr - mu) * rs;
    if (beta) yr += eigen::array(beta, C);
  }
}
}  // namespace

void layer_norm_rows(const Scalar* x, const Scalar* gamma, const Scalar* beta, Scalar* y,
                     Scalar* mean, Scalar* rstd, int64_t rows, int64_t C, Scalar eps) {
  const profile::Scope timed("norm");
  parallel::parallel_for(rows, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      // Two-pass variance: no cancellation when |mean| >> std. The sums run
      // in vec's lane order (not Eigen's, which starts at the row's alignment).
      const Scalar mu = vec::sum(x + r * C, C) / static_cast<Scalar>(C);
      const Scalar var = vec::sum_sq_dev(x + r * C, mu, C) / static_cast<Scalar>(C);
      const Scalar rs = 1.0f / std::sqrt(var + eps);
      mean[r] = mu;
      rstd[r] = rs;
      normalise_row(x + r * C, gamma, beta, mu, rs, y + r * C, C);
    }
  });
}

void layer_norm_apply_rows(const Scalar* x, const Scalar* gamma, const Scalar* beta, const Scalar* mean,
                           const Scalar* rstd, Scalar* y, int64_t rows, int64_t C) {
  const profile::Scope timed("norm");
  parallel::parallel_for(rows, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) normalise_row(x + r * C, gamma, beta, mean[r], rstd[r], y + r * C, C);
  });
}

void layer_norm_backward_rows(const Scalar* dy, const Scalar* x, const Scalar* gamma,
                              const Scalar* mean, const Scalar* rstd, Scalar* dx, Scalar* dgamma,
                              Scalar* dbeta, int64_t rows, int64_t C) {
  const profile::Scope timed("norm");
  // dgamma and dbeta are summed per fixed block of rows in the same pass as
  // dx, then the blocks in order: one pass over dy and x, and the same sums
  // for any thread count. Written with packets rather than Eigen array
  // expressions: a row took seven expressions (each with its own setup and
  // two with horizontal sums), 1 ns per element in a training step.
  using namespace Eigen::internal;
  using eigen::Packet;
  constexpr int64_t L = eigen::kPacketSize;
  const int64_t blocks = (rows + kParamRowBlock - 1) / kParamRowBlock;
  std::vector<Scalar> partial(static_cast<size_t>((dgamma || dbeta) ? blocks * 2 * C : 0), 0.0f);
  using eigen::load_upto;  // a partial last packet reads 0 in its other lanes
  using eigen::store_upto;
  parallel::parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      Scalar* pg = partial.empty() ? nullptr : partial.data() + blk * 2 * C;  // dgamma, then dbeta
      for (int64_t r = blk * kParamRowBlock, r1 = std::min(rows, r + kParamRowBlock); r < r1; ++r) {
        const Scalar* dyr = dy + r * C;
        const Scalar* xr = x + r * C;
        const Packet mu = pset1<Packet>(mean[r]), rs = pset1<Packet>(rstd[r]);
        // g = dy gamma, xhat = (x - mean) rstd; first the row sums of g and g xhat.
        Packet sum_g = pset1<Packet>(0.0f), sum_gx = pset1<Packet>(0.0f);
        for (int64_t c = 0; c < C; c += L) {
          const int64_t n = std::min(L, C - c);
          const Packet d = load_upto(dyr + c, n), xhat = pmul(psub(load_upto(xr + c, n), mu), rs);
          const Packet g = gamma ? pmul(d, load_upto(gamma + c, n)) : d;
          sum_g = padd(sum_g, g);
          sum_gx = pmadd(g, xhat, sum_gx);
          if (pg) {
            store_upto(pg + c, pmadd(d, xhat, load_upto(pg + c, n)), n);
            store_upto(pg + C + c, padd(d, load_upto(pg + C + c, n)), n);
          }
        }
        const Packet mg = pset1<Packet>(eigen::sum(sum_g) / static_cast<Scalar>(C));
        const Packet mgx = pset1<Packet>(eigen::sum(sum_gx) / static_cast<Scalar>(C));
        // dx = rstd (g - mean(g) - xhat mean(g xhat))
        for (int64_t c = 0; c < C; c += L) {
          const int64_t n = std::min(L, C - c);
          const Packet d = load_upto(dyr + c, n), xhat = pmul(psub(load_upto(xr + c, n), mu), rs);
          const Packet g = gamma ? pmul(d, load_upto(gamma + c, n)) : d;
          store_upto(dx + r * C + c, pmul(rs, psub(psub(g, mg), pmul(xhat, mgx))), n);
        }
      }
    }
  });
  for (int64_t blk = 0; blk < blocks && !partial.empty(); ++blk) {
    const Scalar* pg = partial.data() + blk * 2 * C;
    if (dgamma) eigen::array(dgamma, C) += eigen::array(pg, C);
    if (dbeta) eigen::array(dbeta, C) += eigen::array(pg + C, C);
  }
}

void rms_norm_rows(const Scalar* x, const Scalar* gamma, Scalar* y, Scalar* rstd, int64_t rows,
                   int64_t C, Scalar eps) {
  const profile::Scope timed("norm");
  parallel::parallel_for(rows, row_grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      auto xr = eigen::array(x + r * C, C);
      const Scalar rs = 1.0f / std::sqrt(vec::dot(x + r * C, x + r * C, C) / static_cast<Scalar>(C) + eps);
      rstd[r] = rs;
      auto yr = eigen::array(y + r * C, C);
      yr = xr * rs;
      if (gamma) yr *= eigen::array(gamma, C);
    }
  });
}

void rms_norm_backward_rows(const Scalar* dy, const Scalar* x, const Scalar* gamma,
                            const Scalar* rstd, Scalar* dx, Scalar* dgamma, int64_t rows,
                            int64_t C) {
  const profile::Scope timed("norm");
  parallel::parallel_for(rows, row_grain(C), [&](int64_t r0, int64_t r1) {
    eigen::Array g(C), xhat(C);
    for (int64_t r = r0; r < r1; ++r) {
      xhat = eigen::array(x + r * C, C) * rstd[r];
      g = eigen::array(dy + r * C, C);
      if (gamma) g *= eigen::array(gamma, C);
      eigen::array(dx + r * C, C) = rstd[r] * (g - xhat * (vec::dot(g.data(), xhat.data(), C) / static_cast<Scalar>(C)));
    }
  });
  accumulate_rows(dgamma, rows, C, [&](int64_t r, int64_t c0, int64_t n) {
    return eigen::array(dy + r * C + c0, n) * (eigen::array(x + r * C + c0, n) * rstd[r]);
  });
}

}  // namespace tapeformer::kernels
