#include "core/kernels/favor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/eigen.h"
#include "core/parallel.h"

namespace tapeformer::kernels {
namespace {

constexpr Scalar kInf = std::numeric_limits<Scalar>::infinity();

// e^(from - to) for a max that grows from `from` to `to` (0 when nothing was held).
Scalar rescale(Scalar from, Scalar to) { return from == -kInf ? 0.0f : std::exp(from - to); }

// Key row b_i (R) with value v_i (M) into the state S~ (R, M), z~ (R) kept
// under the running max c (R), rescaled where the max grows.
void take_key(Scalar* S, Scalar* z, Scalar* c, const Scalar* bi, const Scalar* vi, int64_t R, int64_t M) {
  const auto v = eigen::array(vi, M);
  for (int64_t r = 0; r < R; ++r) {
    if (bi[r] > c[r]) {
      const Scalar f = rescale(c[r], bi[r]);
      eigen::array(S + r * M, M) *= f;
      z[r] *= f;
      c[r] = bi[r];
    }
    const Scalar e = std::exp(bi[r] - c[r]);
    eigen::array(S + r * M, M) += e * v;
    z[r] += e;
  }
}

// One slice's forward from its state: keys enter the state before their own query sees it.
void scan_slice(Scalar* S, Scalar* z, Scalar* c, const Scalar* a, const Scalar* b, const Scalar* v, Scalar* y,
                Scalar* L, int64_t T, int64_t R, int64_t M, std::vector<Scalar>& w) {
  for (int64_t i = 0; i < T; ++i) {
    take_key(S, z, c, b + i * R, v + i * M, R, M);
    const Scalar* ai = a + i * R;
    Scalar Mi = -kInf;
    for (int64_t r = 0; r < R; ++r) Mi = std::max(Mi, ai[r] + c[r]);
    auto yi = eigen::array(y + i * M, M);
    yi.setZero();
    Scalar den = 0;
    for (int64_t r = 0; r < R; ++r) {
      w[r] = std::exp(ai[r] + c[r] - Mi);
      yi += w[r] * eigen::array(S + r * M, M);
      den += w[r] * z[r];
    }
    yi /= den;
    if (L) L[i] = Mi + std::log(den);
  }
}

}  // namespace

void favor_scan(Scalar* S, Scalar* z, Scalar* c, const Scalar* a, const Scalar* b, const Scalar* v, Scalar* y, Scalar* L,
                const FavorShape& s) {
  const int64_t T = s.T, R = s.R, M = s.M;
  parallel::parallel_for(s.BH, 1, [&](int64_t s0, int64_t s1) {
    std::vector<Scalar> w(static_cast<size_t>(R));
    for (int64_t q = s0; q < s1; ++q)
      scan_slice(S + q * R * M, z + q * R, c + q * R, a + q * T * R, b + q * T * R, v + q * T * M, y + q * T * M,
                 L ? L + q * T : nullptr, T, R, M, w);
  });
}

void favor_forward(const Scalar* a, const Scalar* b, const Scalar* v, Scalar* y, Scalar* L, const FavorShape& s) {
  const int64_t T = s.T, R = s.R, M = s.M;
  parallel::parallel_for(s.BH, 1, [&](int64_t s0, int64_t s1) {
    std::vector<Scalar> S(static_cast<size_t>(R * M)), z(static_cast<size_t>(R)), c(static_cast<size_t>(R)),
        w(static_cast<size_t>(R));
    for (int64_t q = s0; q < s1; ++q) {
      std::fill(S.begin(), S.end(), 0.0f);
      std::fill(z.begin(), z.end(), 0.0f);
      std::fill(c.begin(), c.end(), -kInf);
      scan_slice(S.data(), z.data(), c.data(), a + q * T * R, b + q * T * R, v + q * T * M, y + q * T * M, L + q * T, T,
                 R, M, w);
    }
  });
}

void favor_backward(const Scalar* a, const Scalar* b, const Scalar* v, const Scalar* y, const Scalar* L,
                    const Scalar* dy, Scalar* da, Scalar* db, Scalar* dv, const FavorShape& s) {
  const int64_t T = s.T, R = s.R, M = s.M;
  parallel::parallel_for(s.BH, 1, [&](int64_t s0, int64_t s1) {
    std::vector<Scalar> S(static_cast<size_t>(R * M)), z(static_cast<size_t>(R)), c(static_cast<size_t>(R)),
        gy(static_cast<size_t>(T));
    for (int64_t q = s0; q < s1; ++q) {
      const Scalar *aq = a + q * T * R, *bq = b + q * T * R, *vq = v + q * T * M, *yq = y + q * T * M,
                   *Lq = L + q * T, *gq = dy + q * T * M;
      for (int64_t i = 0; i < T; ++i)
        gy[i] = (eigen::array(gq + i * M, M) * eigen::array(yq + i * M, M)).sum();  // g_i . y_i
      // da: the forward's states again, position by position.
      if (da) {
        std::fill(S.begin(), S.end(), 0.0f);
        std::fill(z.begin(), z.end(), 0.0f);
        std::fill(c.begin(), c.end(), -kInf);
        for (int64_t i = 0; i < T; ++i) {
          take_key(S.data(), z.data(), c.data(), bq + i * R, vq + i * M, R, M);
          const auto gi = eigen::array(gq + i * M, M);
          for (int64_t r = 0; r < R; ++r) {
            const Scalar sg = (eigen::array(S.data() + r * M, M) * gi).sum();
            da[(q * T + i) * R + r] = std::exp(aq[i * R + r] + c[r] - Lq[i]) * (sg - gy[i] * z[r]);
          }
        }
      }
      // db, dv: a reverse scan over the queries at or after each key.
      if (db || dv) {
        std::vector<Scalar>& G = S;  // sum_{i>=j} e^(a_ir - L_i - n_r) g_i, (R, M)
        std::vector<Scalar>& rho = z;  // sum_{i>=j} e^(a_ir - L_i - n_r) (g_i . y_i)
        std::vector<Scalar>& n = c;    // their running max of a_ir - L_i
        std::fill(G.begin(), G.end(), 0.0f);
        std::fill(rho.begin(), rho.end(), 0.0f);
        std::fill(n.begin(), n.end(), -kInf);
        for (int64_t j = T - 1; j >= 0; --j) {
          const auto gj = eigen::array(gq + j * M, M);
          for (int64_t r = 0; r < R; ++r) {
            const Scalar t = aq[j * R + r] - Lq[j];
            if (t > n[r]) {
              const Scalar f = rescale(n[r], t);
              eigen::array(G.data() + r * M, M) *= f;
              rho[r] *= f;
              n[r] = t;
            }
            const Scalar e = std::exp(t - n[r]);
            eigen::array(G.data() + r * M, M) += e * gj;
            rho[r] += e * gy[j];
          }
          const auto vj = eigen::array(vq + j * M, M);
          if (dv) eigen::array(dv + (q * T + j) * M, M).setZero();
          for (int64_t r = 0; r < R; ++r) {
            const Scalar p = std::exp(bq[j * R + r] + n[r]);  // <= 1
            const auto Gr = eigen::array(G.data() + r * M, M);
            if (db) db[(q * T + j) * R + r] = p * ((Gr * vj).sum() - rho[r]);
            if (dv) eigen::array(dv + (q * T + j) * M, M) += p * Gr;
          }
        }
      }
    }
  });
}

}  // namespace tapeformer::kernels
