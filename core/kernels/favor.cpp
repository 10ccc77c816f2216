#include "tapeformer/core/kernels/favor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/kernels/vector_loops.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/profile.h"

namespace tapeformer::kernels {
namespace {

constexpr Scalar kInf = std::numeric_limits<Scalar>::infinity();

using Eigen::internal::padd;
using Eigen::internal::pmadd;
using Eigen::internal::pmul;
using Eigen::internal::pset1;
using Eigen::internal::psub;
using vec::load_upto;
using vec::Packet;
using vec::store_upto;

// out_r = e^(x_r + y_r + k), r < n, in packets (any of x, y may be null: 0).
void exp_sum(Scalar* out, const Scalar* x, const Scalar* y, Scalar k, int64_t n) {
  const Packet pk = pset1<Packet>(k);
  vec::packets(n, [&](int64_t i, int64_t l) {
    Packet t = pk;
    if (x) t = padd(t, load_upto(x + i, l));
    if (y) t = padd(t, load_upto(y + i, l));
    store_upto(out + i, eigen::exp(t), l);
  });
}

constexpr int64_t kLanes = eigen::kPacketSize;

// The state's row products, a packet of columns at a time over every row
// (rows are a head's width: a few packets, kept in L1).
//
// Adds row x (M) with weights e^(t_r - n_r) to the sums S (R, M) and z (R)
// (z_r gains xs per unit of weight), kept under the running max n (R): n
// rises to max(n, t), and what the sums held is scaled by e^(n_old - n_new)
// (1 where the max stays). Every exponent is <= 0. work: 2 R scratch; on
// exit work[0, R) holds the weights e^(t - n).
void add_row(Scalar* S, Scalar* z, Scalar* n, const Scalar* t, const Scalar* x, Scalar xs, int64_t R, int64_t M,
             Scalar* work) {
  Scalar *e = work, *f = work + R;
  const Packet pxs = pset1<Packet>(xs);
  vec::packets(R, [&](int64_t i, int64_t l) {
    const Packet pn = load_upto(n + i, l), pt = load_upto(t + i, l), pm = Eigen::internal::pmax(pn, pt);
    const Packet pf = eigen::exp(psub(pn, pm)), pe = eigen::exp(psub(pt, pm));  // before the first row pf ~ 0 scales S = z = 0
    store_upto(n + i, pm, l);
    store_upto(f + i, pf, l);
    store_upto(e + i, pe, l);
    store_upto(z + i, pmadd(pe, pxs, pmul(pf, load_upto(z + i, l))), l);
  });
  for (int64_t m = 0; m < M; m += kLanes) {
    const int64_t l = std::min(kLanes, M - m);
    const Packet px = load_upto(x + m, l);
    for (int64_t r = 0; r < R; ++r) {
      Scalar* p = S + r * M + m;
      store_upto(p, pmadd(pset1<Packet>(e[r]), px, pmul(pset1<Packet>(f[r]), load_upto(p, l))), l);
    }
  }
}
// y (M) = sum_r w_r S_r
void combine_rows(Scalar* y, const Scalar* w, const Scalar* S, int64_t R, int64_t M) {
  for (int64_t m = 0; m < M; m += kLanes) {
    const int64_t l = std::min(kLanes, M - m);
    Packet acc = pset1<Packet>(0.0f);
    for (int64_t r = 0; r < R; ++r) acc = pmadd(pset1<Packet>(w[r]), load_upto(S + r * M + m, l), acc);
    store_upto(y + m, acc, l);
  }
}
// out_r = S_r . x, r < R
void row_dots(Scalar* out, const Scalar* S, const Scalar* x, int64_t R, int64_t M) {
  for (int64_t r = 0; r < R; ++r) out[r] = vec::dot(S + r * M, x, M);
}

// Key row b_i (R) with value v_i (M) into the state S~ (R, M), z~ (R) kept
// under the running max c (R). work: 2 R scratch.
void take_key(Scalar* S, Scalar* z, Scalar* c, const Scalar* bi, const Scalar* vi, int64_t R, int64_t M, Scalar* work) {
  add_row(S, z, c, bi, vi, 1.0f, R, M, work);
}

// One slice's forward from its state: keys enter the state before their own query sees it.
// w: 3 R scratch.
void scan_slice(Scalar* S, Scalar* z, Scalar* c, const Scalar* a, const Scalar* b, const Scalar* v, Scalar* y,
                Scalar* L, int64_t T, int64_t R, int64_t M, std::vector<Scalar>& w) {
  for (int64_t i = 0; i < T; ++i) {
    take_key(S, z, c, b + i * R, v + i * M, R, M, w.data() + R);
    const Scalar* ai = a + i * R;
    Scalar Mi = -kInf;
    for (int64_t r = 0; r < R; ++r) Mi = std::max(Mi, ai[r] + c[r]);
    exp_sum(w.data(), ai, c, -Mi, R);  // e^(a + c - M_i) <= 1
    const Scalar den = vec::dot(w.data(), z, R);
    combine_rows(y + i * M, w.data(), S, R, M);
    eigen::array(y + i * M, M) /= den;
    if (L) L[i] = Mi + std::log(den);
  }
}

}  // namespace

void favor_scan(Scalar* S, Scalar* z, Scalar* c, const Scalar* a, const Scalar* b, const Scalar* v, Scalar* y, Scalar* L,
                const FavorShape& s) {
  const int64_t T = s.T, R = s.R, M = s.M;
  parallel::parallel_for(s.BH, 1, [&](int64_t s0, int64_t s1) {
    std::vector<Scalar> w(static_cast<size_t>(3 * R));
    for (int64_t q = s0; q < s1; ++q)
      scan_slice(S + q * R * M, z + q * R, c + q * R, a + q * T * R, b + q * T * R, v + q * T * M, y + q * T * M,
                 L ? L + q * T : nullptr, T, R, M, w);
  });
}

void favor_forward(const Scalar* a, const Scalar* b, const Scalar* v, Scalar* y, Scalar* L, const FavorShape& s) {
  const profile::Scope timed("attention");
  const int64_t T = s.T, R = s.R, M = s.M;
  parallel::parallel_for(s.BH, 1, [&](int64_t s0, int64_t s1) {
    std::vector<Scalar> S(static_cast<size_t>(R * M)), z(static_cast<size_t>(R)), c(static_cast<size_t>(R)),
        w(static_cast<size_t>(3 * R));
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
  const profile::Scope timed("attention");
  const int64_t T = s.T, R = s.R, M = s.M;
  parallel::parallel_for(s.BH, 1, [&](int64_t s0, int64_t s1) {
    std::vector<Scalar> S(static_cast<size_t>(R * M)), z(static_cast<size_t>(R)), c(static_cast<size_t>(R)),
        e(static_cast<size_t>(2 * R)), t(static_cast<size_t>(R)), gy(static_cast<size_t>(T));
    for (int64_t q = s0; q < s1; ++q) {
      const Scalar *aq = a + q * T * R, *bq = b + q * T * R, *vq = v + q * T * M, *yq = y + q * T * M,
                   *Lq = L + q * T, *gq = dy + q * T * M;
      for (int64_t i = 0; i < T; ++i) gy[i] = vec::dot(gq + i * M, yq + i * M, M);  // g_i . y_i
      // da: the forward's states again, position by position.
      if (da) {
        std::fill(S.begin(), S.end(), 0.0f);
        std::fill(z.begin(), z.end(), 0.0f);
        std::fill(c.begin(), c.end(), -kInf);
        for (int64_t i = 0; i < T; ++i) {
          take_key(S.data(), z.data(), c.data(), bq + i * R, vq + i * M, R, M, e.data());
          exp_sum(e.data(), aq + i * R, c.data(), -Lq[i], R);  // e^(a_ir + c_r - L_i)
          Scalar* dai = da + (q * T + i) * R;
          row_dots(dai, S.data(), gq + i * M, R, M);  // S~_r . g_i
          for (int64_t r = 0; r < R; ++r) dai[r] = e[r] * (dai[r] - gy[i] * z[r]);
        }
      }
      // db, dv: a reverse scan over the queries at or after each key.
      if (db || dv) {
        std::vector<Scalar>& G = S;    // sum_{i>=j} e^(a_ir - L_i - n_r) g_i, (R, M)
        std::vector<Scalar>& rho = z;  // sum_{i>=j} e^(a_ir - L_i - n_r) (g_i . y_i)
        std::vector<Scalar>& n = c;    // their running max of a_ir - L_i
        std::fill(G.begin(), G.end(), 0.0f);
        std::fill(rho.begin(), rho.end(), 0.0f);
        std::fill(n.begin(), n.end(), -kInf);
        for (int64_t j = T - 1; j >= 0; --j) {
          const Scalar* aj = aq + j * R;
          for (int64_t r = 0; r < R; ++r) t[r] = aj[r] - Lq[j];
          add_row(G.data(), rho.data(), n.data(), t.data(), gq + j * M, gy[j], R, M, e.data());
          exp_sum(e.data(), bq + j * R, n.data(), 0.0f, R);  // p_r = e^(b_jr + n_r) <= 1
          const Scalar* vj = vq + j * M;
          if (db) {
            Scalar* dbj = db + (q * T + j) * R;
            row_dots(dbj, G.data(), vj, R, M);
            for (int64_t r = 0; r < R; ++r) dbj[r] = e[r] * (dbj[r] - rho[r]);
          }
          if (dv) combine_rows(dv + (q * T + j) * M, e.data(), G.data(), R, M);
        }
      }
    }
  });
}

}  // namespace tapeformer::kernels
