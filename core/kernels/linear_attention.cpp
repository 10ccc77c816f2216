#include "tapeformer/core/kernels/linear_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/kernels/copy.h"
#include "tapeformer/core/kernels/matmul.h"
#include "tapeformer/core/kernels/vector_loops.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/profile.h"

namespace tapeformer::kernels {
namespace {

// Positions per chunk (docs/math.md#chunked-form): the masked in-chunk products are 64 x 64,
// wide enough for the packet GEMM, and the state products cost 64 x C x M per
// chunk, about as much as the in-chunk part for C, M ~ 64.
constexpr int64_t kChunk = 64;
// Row blocks inside a chunk: rows [r0, r1) of a masked product only form
// columns [0, r1), which skips 3/8 of the 64 x 64 work.
constexpr int64_t kBlock = 16;

size_t sz(int64_t n) { return static_cast<size_t>(n); }

using eigen::load_upto;
using eigen::Packet;
using eigen::store_upto;
using vec::axpy;
using vec::dot;
using vec::mul_add;
using vec::packets;
using vec::sum;

// C (M x N, ld ldc) = A B, or += when accumulate; A(i, k) = a[i * a_rs + k * a_cs],
// B (K x N) by rows of stride ldb (the packet GEMM reads B by rows).
void product(const Scalar* a, int64_t a_rs, int64_t a_cs, int64_t M, int64_t K, const Scalar* b, int64_t ldb,
             int64_t N, Scalar* c, int64_t ldc, bool accumulate) {
  gemm({a, M, K, a_rs, a_cs}, {b, K, N, ldb, 1}, c, ldc, accumulate);
}

// dst (cols, rows), rows ld_dst apart = src^T, src (rows, cols) with rows ld apart.
void transpose(const Scalar* src, int64_t ld, int64_t rows, int64_t cols, Scalar* dst, int64_t ld_dst) {
  strided_copy(src, Strides{1, ld}, dst, Strides{ld_dst, 1}, Shape{cols, rows});
}

// out (L, L), rows kChunk apart: out_ij = x_i . y_j + add_i for j <= i, 0 for j > i,
// with x (L, K) rows ldx apart and yt = y^T (K, L) rows kChunk apart; add may be null.
// Entries j > i are overwritten with exact zeros, so nothing of a future row
// reaches a result (the products below then add 0 times a future value: exact
// for finite values).
void lower_product(const Scalar* x, int64_t ldx, const Scalar* yt, int64_t L, int64_t K, const Scalar* add,
                   Scalar* out) {
  for (int64_t r0 = 0; r0 < L; r0 += kBlock) {
    const int64_t r1 = std::min(L, r0 + kBlock);
    product(x + r0 * ldx, ldx, 1, r1 - r0, K, yt, kChunk, r1, out + r0 * kChunk, kChunk, false);
    for (int64_t i = r0; i < r1; ++i) {
      Scalar* row = out + i * kChunk;
      if (add) eigen::array(row, i + 1) += add[i];
      std::fill(row + i + 1, row + L, 0.0f);
    }
  }
}

// out (L, N) = tri rhs (or +=) for a lower-triangular tri from lower_product;
// rhs (L, N) rows ldr apart. Row block [r0, r1) only needs rhs rows [0, r1).
void lower_times(const Scalar* tri, int64_t L, const Scalar* rhs, int64_t ldr, int64_t N, Scalar* out, int64_t ldo,
                 bool accumulate) {
  for (int64_t r0 = 0; r0 < L; r0 += kBlock) {
    const int64_t r1 = std::min(L, r0 + kBlock);
    product(tri + r0 * kChunk, kChunk, 1, r1 - r0, r1, rhs, ldr, N, out + r0 * ldo, ldo, accumulate);
  }
}

// out (L, N) = tri^T rhs: row block [c0, c1) only needs rhs rows [c0, L);
// tri^T is read through strides.
void upper_times(const Scalar* tri, int64_t L, const Scalar* rhs, int64_t ldr, int64_t N, Scalar* out, int64_t ldo) {
  for (int64_t c0 = 0; c0 < L; c0 += kBlock) {
    const int64_t c1 = std::min(L, c0 + kBlock);
    product(tri + c0 * kChunk + c0, 1, kChunk, c1 - c0, L - c0, rhs + c0 * ldr, ldr, N, out + c0 * ldo, ldo, false);
  }
}

// sum += the L rows of x (L, C): the running z of the value column 1.
void add_rows(const Scalar* x, int64_t L, int64_t C, Scalar* sum) {
  for (int64_t i = 0; i < L; ++i) axpy(sum, 1.0f, x + i * C, C);
}

// Per-thread buffers: chunk-sized products plus C x M running states.
struct Work {
  Work(int64_t C, int64_t M)
      : tri(sz(kChunk * kChunk)),
        tri2(sz(kChunk * kChunk)),
        trans(sz(std::max(C, M) * kChunk)),
        g(sz(kChunk * M)),
        gam(sz(kChunk)),
        S(sz(C * M)),
        St(sz(M * C)),
        R(sz(C * M)),
        Rt(sz(M * C)),
        z(sz(C)),
        r(sz(C)) {}
  std::vector<Scalar> tri, tri2;  // (kChunk, kChunk) masked products
  std::vector<Scalar> trans;      // (C or M, kChunk) a transposed chunk
  std::vector<Scalar> g, gam;     // (kChunk, M), (kChunk): g^ and gam of a chunk
  std::vector<Scalar> S, St;      // (C, M), (M, C): forward running sums or KV
  std::vector<Scalar> R, Rt;      // (C, M), (M, C): reverse running sums or dKV
  std::vector<Scalar> z, r;       // (C): the value column 1's S and R
};

// Runs fn(w, work) for every (b, h) slice w, one Work per parallel chunk.
template <class F>
void for_each_head(const LinearAttentionShape& s, F&& fn) {
  parallel::parallel_for(s.BH, 1, [&](int64_t w0, int64_t w1) {
    Work work(s.C, s.M);
    for (int64_t w = w0; w < w1; ++w) fn(w, work);
  });
}

// The gradient of the chunk's rows [t0, t0 + L) w.r.t. v~ = [v, 1]:
// g^_i = dy_i / den_i (L, M) and gam_i = -(dy_i . y_i) / den_i (L).
void normalised_gradient(const Scalar* dy, const Scalar* y, const Scalar* den, int64_t L, int64_t M, Scalar* g,
                         Scalar* gam) {
  for (int64_t i = 0; i < L; ++i) {
    const Scalar inv = 1.0f / den[i];
    eigen::array(g + i * M, M) = eigen::array(dy + i * M, M) * inv;
    gam[i] = -dot(dy + i * M, y + i * M, M) * inv;
  }
}

// One (b, h) slice of the causal product, or of causal linear attention when
// den is not null (den_i is then written and y_i divided by it).
void causal_forward_head(const Scalar* a, const Scalar* b, const Scalar* v, Scalar* y, Scalar* den, Scalar eps,
                         int64_t T, int64_t C, int64_t M, Work& w) {
  Scalar* S = w.S.data();  // (C, M): sum of b_j v_j^T over the chunks before
  Scalar* z = w.z.data();  // (C): sum of b_j over the chunks before
  std::fill(w.S.begin(), w.S.end(), 0.0f);
  std::fill(w.z.begin(), w.z.end(), 0.0f);
  for (int64_t t0 = 0; t0 < T; t0 += kChunk) {
    const int64_t L = std::min(kChunk, T - t0);
    const Scalar *ac = a + t0 * C, *bc = b + t0 * C, *vc = v + t0 * M;
    Scalar* yc = y + t0 * M;
    transpose(bc, C, L, C, w.trans.data(), kChunk);
    lower_product(ac, C, w.trans.data(), L, C, nullptr, w.tri.data());  // P = a b^T, masked
    lower_times(w.tri.data(), L, vc, M, M, yc, M, false);                 // y = P v
    if (t0 > 0) product(ac, C, 1, L, C, S, M, M, yc, M, true);          // y += a S
    if (den) {
      for (int64_t i = 0; i < L; ++i) {
        Scalar d = sum(w.tri.data() + i * kChunk, i + 1) + eps;  // P 1: the column 1
        if (t0 > 0) d += dot(ac + i * C, z, C);
        den[t0 + i] = d;
        eigen::array(yc + i * M, M) /= d;
      }
    }
    if (t0 + L == T) break;  // no later chunk reads the state
    if (den) add_rows(bc, L, C, z);
    product(bc, 1, C, C, L, vc, M, M, S, M, true);  // S += b^T v
  }
}

// The backward of causal_forward_head: dy is the output gradient; with den
// (linear attention) g~ = [g^, gam] from y and den, else g~ = dy.
void causal_backward_head(const Scalar* a, const Scalar* b, const Scalar* v, const Scalar* y, const Scalar* den,
                          const Scalar* dy, Scalar* da, Scalar* db, Scalar* dv, int64_t T, int64_t C, int64_t M,
                          Work& w) {
  Scalar* gam = den ? w.gam.data() : nullptr;
  auto chunk_gradient = [&](int64_t t0, int64_t L) -> const Scalar* {
    if (!den) return dy + t0 * M;
    normalised_gradient(dy + t0 * M, y + t0 * M, den + t0, L, M, w.g.data(), gam);
    return w.g.data();
  };
  // Pass 1, chunks in order: da_i = S_i g^_i + gam_i z_i, with St = S^T and z
  // summed over the chunks before.
  Scalar *St = w.St.data(), *z = w.z.data();
  std::fill(w.St.begin(), w.St.end(), 0.0f);
  std::fill(w.z.begin(), w.z.end(), 0.0f);
  for (int64_t t0 = 0; t0 < T; t0 += kChunk) {
    const int64_t L = std::min(kChunk, T - t0);
    const Scalar *bc = b + t0 * C, *vc = v + t0 * M;
    Scalar* dac = da + t0 * C;
    const Scalar* gc = chunk_gradient(t0, L);
    transpose(vc, M, L, M, w.trans.data(), kChunk);
    lower_product(gc, M, w.trans.data(), L, M, gam, w.tri.data());  // Q_ij = g~_i . v~_j = g^_i . v_j + gam_i
    lower_times(w.tri.data(), L, bc, C, C, dac, C, false);           // da = Q b
    if (t0 > 0) {
      product(gc, M, 1, L, M, St, C, C, dac, C, true);  // da += g^ S^T
      if (den)
        for (int64_t i = 0; i < L; ++i) axpy(dac + i * C, gam[i], z, C);
    }
    if (t0 + L == T) break;
    product(vc, 1, M, M, L, bc, C, C, St, C, true);  // S^T += v^T b
    if (den) add_rows(bc, L, C, z);
  }
  // Pass 2, chunks in reverse: R = sum a_i g^_i^T (Rt = R^T) and r = sum gam_i a_i
  // over the chunks after; db_j = R_j v_j + r_j, dv_j = R_j^T b_j.
  Scalar *R = w.R.data(), *Rt = w.Rt.data(), *r = w.r.data();
  std::fill(w.R.begin(), w.R.end(), 0.0f);
  std::fill(w.r.begin(), w.r.end(), 0.0f);
  for (int64_t t0 = (T - 1) / kChunk * kChunk; t0 >= 0; t0 -= kChunk) {
    const int64_t L = std::min(kChunk, T - t0);
    const Scalar *ac = a + t0 * C, *bc = b + t0 * C, *vc = v + t0 * M;
    Scalar *dbc = db + t0 * C, *dvc = dv + t0 * M;
    const Scalar* gc = den ? w.g.data() : dy + t0 * M;
    if (t0 + L < T) {  // pass 1 ended on the last chunk: its g^, gam and Q are still in w
      gc = chunk_gradient(t0, L);
      transpose(vc, M, L, M, w.trans.data(), kChunk);
      lower_product(gc, M, w.trans.data(), L, M, gam, w.tri.data());  // Q as in pass 1
    }
    transpose(bc, C, L, C, w.trans.data(), kChunk);
    lower_product(ac, C, w.trans.data(), L, C, nullptr, w.tri2.data());  // P = a b^T, masked
    upper_times(w.tri.data(), L, ac, C, C, dbc, C);                       // db = Q^T a
    upper_times(w.tri2.data(), L, gc, M, M, dvc, M);                      // dv = P^T g^
    if (t0 + L < T) {
      product(vc, M, 1, L, M, Rt, C, C, dbc, C, true);  // db += v R^T
      if (den)
        for (int64_t j = 0; j < L; ++j) axpy(dbc + j * C, 1.0f, r, C);
      product(bc, C, 1, L, C, R, M, M, dvc, M, true);  // dv += b R
    }
    if (t0 == 0) break;
    product(ac, 1, C, C, L, gc, M, M, R, M, true);  // R += a^T g^
    if (den)
      for (int64_t i = 0; i < L; ++i) axpy(r, gam[i], ac + i * C, C);
    transpose(R, M, C, M, Rt, C);
  }
}

// Non-causal linear attention on one slice: KV = b^T v (C, M), z = sum_j b_j,
// y_i = a_i^T KV / (a_i . z + eps).
void full_forward_head(const Scalar* a, const Scalar* b, const Scalar* v, Scalar* y, Scalar* den, Scalar eps,
                       int64_t T, int64_t C, int64_t M, Work& w) {
  Scalar *KV = w.S.data(), *z = w.z.data();
  product(b, 1, C, C, T, v, M, M, KV, M, false);
  std::fill(w.z.begin(), w.z.end(), 0.0f);
  add_rows(b, T, C, z);
  product(a, C, 1, T, C, KV, M, M, y, M, false);
  for (int64_t i = 0; i < T; ++i) {
    den[i] = dot(a + i * C, z, C) + eps;
    eigen::array(y + i * M, M) /= den[i];
  }
}

// Its backward: dKV = a^T g^, dz = a^T gam, da = g^ KV^T + gam z^T,
// db = v dKV^T + 1 dz^T, dv = b dKV.
void full_backward_head(const Scalar* a, const Scalar* b, const Scalar* v, const Scalar* y, const Scalar* den,
                        const Scalar* dy, Scalar* da, Scalar* db, Scalar* dv, int64_t T, int64_t C, int64_t M,
                        Work& w) {
  Scalar *KV = w.S.data(), *KVt = w.St.data(), *z = w.z.data();
  Scalar *dKV = w.R.data(), *dKVt = w.Rt.data(), *dz = w.r.data();
  product(b, 1, C, C, T, v, M, M, KV, M, false);
  transpose(KV, M, C, M, KVt, C);
  std::fill(w.z.begin(), w.z.end(), 0.0f);
  add_rows(b, T, C, z);
  std::fill(w.R.begin(), w.R.end(), 0.0f);
  std::fill(w.r.begin(), w.r.end(), 0.0f);
  for (int64_t t0 = 0; t0 < T; t0 += kChunk) {  // g^ chunk by chunk: no T x M buffer
    const int64_t L = std::min(kChunk, T - t0);
    const Scalar* ac = a + t0 * C;
    Scalar* dac = da + t0 * C;
    Scalar *g = w.g.data(), *gam = w.gam.data();
    normalised_gradient(dy + t0 * M, y + t0 * M, den + t0, L, M, g, gam);
    product(g, M, 1, L, M, KVt, C, C, dac, C, false);  // da = g^ KV^T
    for (int64_t i = 0; i < L; ++i) {
      axpy(dac + i * C, gam[i], z, C);
      axpy(dz, gam[i], ac + i * C, C);
    }
    product(ac, 1, C, C, L, g, M, M, dKV, M, true);  // dKV += a^T g^
  }
  transpose(dKV, M, C, M, dKVt, C);
  product(v, M, 1, T, M, dKVt, C, C, db, C, false);  // db = v dKV^T
  for (int64_t j = 0; j < T; ++j) axpy(db + j * C, 1.0f, dz, C);
  product(b, C, 1, T, C, dKV, M, M, dv, M, false);  // dv = b dKV
}

// ---- efficient attention ----------------------------------------------------------

// out = softmax(x) over C entries.
void softmax_row(const Scalar* x, int64_t C, Scalar* out) {
  using namespace Eigen::internal;
  const Scalar top = *std::max_element(x, x + C);  // exact in any order
  const Packet mx = pset1<Packet>(top);
  packets(C, [&](int64_t i, int64_t l) { store_upto(out + i, eigen::exp(psub(load_upto(x + i, l), mx)), l); });
  eigen::array(out, C) *= 1.0f / sum(out, C);
}

// out = e^{x - y} over n entries.
void exp_diff(const Scalar* x, const Scalar* y, int64_t n, Scalar* out) {
  using namespace Eigen::internal;
  packets(n, [&](int64_t i, int64_t l) {
    store_upto(out + i, eigen::exp(psub(load_upto(x + i, l), load_upto(y + i, l))), l);
  });
}

// x = s x + e v over n entries.
void scale_add(Scalar* x, Scalar s, Scalar e, const Scalar* v, int64_t n) {
  using namespace Eigen::internal;
  const Packet ps = pset1<Packet>(s), pe = pset1<Packet>(e);
  packets(n, [&](int64_t i, int64_t l) {
    store_upto(x + i, pmadd(pe, load_upto(v + i, l), pmul(ps, load_upto(x + i, l))), l);
  });
}

// Folds key k_t and value v_t into one slice's running (U, u, m). Feature d
// keeps its sums relative to its running max m[d], so every stored exponent is
// <= 0: with m' = max(m, k_t), the sums are rescaled by s = e^{m - m'} (1 unless
// the max grows; ~0 for the empty state's m = -inf) and k_t enters with
// e = e^{k_t - m'} <= 1. s and e (C) are scratch.
void efficient_update(Scalar* U, Scalar* u, Scalar* m, const Scalar* kt, const Scalar* vt, int64_t C, int64_t M,
                      Scalar* s, Scalar* e) {
  using namespace Eigen::internal;
  packets(C, [&](int64_t i, int64_t l) {
    const Packet mo = load_upto(m + i, l), k = load_upto(kt + i, l), mn = pmax(mo, k);
    const Packet ps = eigen::exp(psub(mo, mn)), pe = eigen::exp(psub(k, mn));
    store_upto(s + i, ps, l);
    store_upto(e + i, pe, l);
    store_upto(u + i, pmadd(ps, load_upto(u + i, l), pe), l);
    store_upto(m + i, mn, l);
  });
  for (int64_t d = 0; d < C; ++d) scale_add(U + d * M, s[d], e[d], vt, M);
}

// T steps of the recurrence for one slice, from the state (U, u, m) on;
// scratch holds 3 C floats.
void efficient_recurrent_head(Scalar* U, Scalar* u, Scalar* m, const Scalar* q, const Scalar* k, const Scalar* v,
                              Scalar* y, int64_t T, int64_t C, int64_t M, Scalar* scratch) {
  Scalar* al = scratch;
  for (int64_t t = 0; t < T; ++t) {
    efficient_update(U, u, m, k + t * C, v + t * M, C, M, scratch + C, scratch + 2 * C);
    softmax_row(q + t * C, C, al);
    eigen::array(al, C) /= eigen::array(u, C);        // al_d / u_d
    product(al, C, 1, 1, C, U, M, M, y + t * M, M, false);  // y_t = sum_d (al_d / u_d) U[d]
  }
}

}  // namespace

void causal_product_forward(const Scalar* a, const Scalar* b, const Scalar* v, Scalar* y,
                            const LinearAttentionShape& s) {
  const profile::Scope timed("attention");
  const int64_t T = s.T, C = s.C, M = s.M;
  for_each_head(s, [&](int64_t w, Work& work) {
    causal_forward_head(a + w * T * C, b + w * T * C, v + w * T * M, y + w * T * M, nullptr, 0, T, C, M, work);
  });
}

void causal_product_backward(const Scalar* a, const Scalar* b, const Scalar* v, const Scalar* dy, Scalar* da,
                             Scalar* db, Scalar* dv, const LinearAttentionShape& s) {
  const profile::Scope timed("attention");
  const int64_t T = s.T, C = s.C, M = s.M;
  for_each_head(s, [&](int64_t w, Work& work) {
    const int64_t x = w * T * C, o = w * T * M;
    causal_backward_head(a + x, b + x, v + o, nullptr, nullptr, dy + o, da + x, db + x, dv + o, T, C, M, work);
  });
}

void linear_attention_forward(const Scalar* a, const Scalar* b, const Scalar* v, Scalar* y, Scalar* den, bool causal,
                              Scalar eps, const LinearAttentionShape& s) {
  const profile::Scope timed("attention");
  const int64_t T = s.T, C = s.C, M = s.M;
  for_each_head(s, [&](int64_t w, Work& work) {
    const int64_t x = w * T * C, o = w * T * M;
    auto head = causal ? causal_forward_head : full_forward_head;
    head(a + x, b + x, v + o, y + o, den + w * T, eps, T, C, M, work);
  });
}

void linear_attention_backward(const Scalar* a, const Scalar* b, const Scalar* v, const Scalar* y, const Scalar* den,
                               const Scalar* dy, Scalar* da, Scalar* db, Scalar* dv, bool causal,
                               const LinearAttentionShape& s) {
  const profile::Scope timed("attention");
  const int64_t T = s.T, C = s.C, M = s.M;
  for_each_head(s, [&](int64_t w, Work& work) {
    const int64_t x = w * T * C, o = w * T * M;
    auto head = causal ? causal_backward_head : full_backward_head;
    head(a + x, b + x, v + o, y + o, den + w * T, dy + o, da + x, db + x, dv + o, T, C, M, work);
  });
}

void efficient_attention_causal_forward(const Scalar* q, const Scalar* k, const Scalar* v, Scalar* y,
                                        const LinearAttentionShape& s) {
  const profile::Scope timed("attention");
  const int64_t T = s.T, C = s.C, M = s.M;
  parallel::parallel_for(s.BH, 1, [&](int64_t w0, int64_t w1) {
    std::vector<Scalar> U(sz(C * M)), u(sz(C)), m(sz(C)), scratch(sz(3 * C));
    for (int64_t w = w0; w < w1; ++w) {
      std::fill(U.begin(), U.end(), 0.0f);
      std::fill(u.begin(), u.end(), 0.0f);
      std::fill(m.begin(), m.end(), -std::numeric_limits<Scalar>::infinity());
      efficient_recurrent_head(U.data(), u.data(), m.data(), q + w * T * C, k + w * T * C, v + w * T * M,
                               y + w * T * M, T, C, M, scratch.data());
    }
  });
}

void efficient_attention_causal_backward(const Scalar* q, const Scalar* k, const Scalar* v, const Scalar* dy,
                                         Scalar* dq, Scalar* dk, Scalar* dv, const LinearAttentionShape& s) {
  const profile::Scope timed("attention");
  const int64_t T = s.T, C = s.C, M = s.M;
  parallel::parallel_for(s.BH, 1, [&](int64_t w0, int64_t w1) {
    std::vector<Scalar> U(sz(C * M)), u(sz(C)), m(sz(C)), al(sz(C)), c(sz(C)), e(sz(C)), f(sz(C));
    std::vector<Scalar> rho(sz(T * C)), ms(sz(T * C)), cs(sz(T * C));  // (T, C) each: rho, m_t, al_t / u~_t
    for (int64_t w = w0; w < w1; ++w) {
      const Scalar *qw = q + w * T * C, *kw = k + w * T * C, *vw = v + w * T * M, *dyw = dy + w * T * M;
      Scalar *dqw = dq + w * T * C, *dkw = dk + w * T * C, *dvw = dv + w * T * M;
      // Pass 1 (t up): the forward's running sums again; rho_t = U dy_t / u~, dq_t.
      std::fill(U.begin(), U.end(), 0.0f);
      std::fill(u.begin(), u.end(), 0.0f);
      std::fill(m.begin(), m.end(), -std::numeric_limits<Scalar>::infinity());
      for (int64_t t = 0; t < T; ++t) {
        efficient_update(U.data(), u.data(), m.data(), kw + t * C, vw + t * M, C, M, c.data(), e.data());
        std::copy(m.begin(), m.end(), ms.begin() + t * C);
        Scalar* rt = rho.data() + t * C;
        for (int64_t d = 0; d < C; ++d) rt[d] = dot(U.data() + d * M, dyw + t * M, M) / u[d];
        softmax_row(qw + t * C, C, al.data());
        const Scalar ar = dot(al.data(), rt, C);
        eigen::array(dqw + t * C, C) = eigen::array(al.data(), C) * (eigen::array(rt, C) - ar);
        eigen::array(cs.data() + t * C, C) = eigen::array(al.data(), C) / eigen::array(u.data(), C);
      }
      // Pass 2 (t down): U now holds R (C, M) and u holds r (C), both stabilised
      // by m_t: R_t = (al_t / u~_t) dy_t + e^{m_t - m_{t+1}} R_{t+1}.
      Scalar *R = U.data(), *r = u.data();
      std::fill(U.begin(), U.end(), 0.0f);
      std::fill(u.begin(), u.end(), 0.0f);
      for (int64_t t = T - 1; t >= 0; --t) {
        const Scalar* mt = ms.data() + t * C;
        if (t + 1 < T) {
          exp_diff(mt, ms.data() + (t + 1) * C, C, f.data());  // e^{m_t - m_{t+1}}: 1 unless the max grew
          for (int64_t d = 0; d < C; ++d) {
            if (f[d] == 1.0f) continue;
            eigen::array(R + d * M, M) *= f[d];
            r[d] *= f[d];
          }
        }
        const Scalar* ct = cs.data() + t * C;
        product(ct, 1, 1, C, 1, dyw + t * M, M, M, R, M, true);  // R += (al_t / u~_t) dy_t^T
        mul_add(r, ct, rho.data() + t * C, C);
        exp_diff(kw + t * C, mt, C, e.data());  // e^{k_t - m_t} <= 1
        product(e.data(), C, 1, 1, C, R, M, M, dvw + t * M, M, false);  // dv_t = sum_d e_d R[d]
        for (int64_t d = 0; d < C; ++d) dkw[t * C + d] = e[d] * (dot(R + d * M, vw + t * M, M) - r[d]);
      }
    }
  });
}

void linear_attention_recurrent(Scalar* S, Scalar* z, const Scalar* a, const Scalar* b, const Scalar* az,
                                const Scalar* bz, const Scalar* v, Scalar* y, int64_t BH, int64_t T, int64_t C,
                                int64_t M, Scalar eps) {
  parallel::parallel_for(BH, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      Scalar *Sw = S + w * C * M, *zw = z + w * C;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t x = (w * T + t) * C, o = (w * T + t) * M;
        product(b + x, 1, 1, C, 1, v + o, M, M, Sw, M, true);  // S += b_t v_t^T
        eigen::array(zw, C) += eigen::array(bz + x, C);
        const Scalar den = dot(az + x, zw, C) + eps;
        product(a + x, C, 1, 1, C, Sw, M, M, y + o, M, false);  // a_t^T S
        eigen::array(y + o, M) /= den;
      }
    }
  });
}

void efficient_attention_recurrent(Scalar* U, Scalar* u, Scalar* m, const Scalar* q, const Scalar* k,
                                   const Scalar* v, Scalar* y, int64_t BH, int64_t T, int64_t C, int64_t M) {
  parallel::parallel_for(BH, 1, [&](int64_t w0, int64_t w1) {
    std::vector<Scalar> scratch(sz(3 * C));
    for (int64_t w = w0; w < w1; ++w)
      efficient_recurrent_head(U + w * C * M, u + w * C, m + w * C, q + w * T * C, k + w * T * C, v + w * T * M,
                               y + w * T * M, T, C, M, scratch.data());
  });
}

}  // namespace tapeformer::kernels
