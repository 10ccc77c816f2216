#include "tapeformer/core/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/copy.h"
#include "tapeformer/core/kernels/matmul.h"
#include "tapeformer/core/kernels/vector_loops.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/profile.h"

namespace tapeformer::kernels {
namespace {

// Causal work is done in blocks of query rows: rows [r0, r1) only see keys
// [0, r1), so the products skip the upper-right blocks that the mask zeroes
// (for T = 64 and 16-row blocks, 5/8 of the full T x T work).
constexpr int64_t kRowBlock = 16;

// C (M x N, row stride ldc) = A B through the packet GEMM, with
// A(i, k) = a[i * a_rs + k * a_cs] and B (K x N) by rows of stride ldb.
void product(const Scalar* a, int64_t a_rs, int64_t a_cs, int64_t M, int64_t K, const Scalar* b, int64_t ldb,
             int64_t N, Scalar* c, int64_t ldc) {
  gemm({a, M, K, a_rs, a_cs}, {b, K, N, ldb, 1}, c, ldc, /*accumulate=*/false);
}

// dst (D, T) = src^T for a (T, D) head slice whose rows are `ld` apart: the
// packet GEMM reads its B operand by rows, so Q K^T and dO V^T need K^T, V^T.
void transpose_head(const Scalar* src, int64_t ld, int64_t T, int64_t D, Scalar* dst) {
  strided_copy(src, Strides{1, ld}, dst, Strides{T, 1}, Shape{D, T});
}

// Row softmax of scale * x[0, n) in place, for a causal row whose first
// `valid` entries are real scores; entries [valid, n) are set to -inf first
// so the row runs in whole packets, and come out (near) 0 for the caller to
// zero. Packet code because the rows are short (1..T): Eigen's setup per
// expression on short dynamic arrays made the softmax 12% slower.
void causal_softmax_row(Scalar* x, int64_t valid, int64_t n, Scalar scale) {
  using namespace Eigen::internal;
  using eigen::Packet;
  constexpr int64_t L = eigen::kPacketSize;
  std::fill(x + valid, x + n, -std::numeric_limits<Scalar>::infinity());
  const int64_t whole = n / L * L;
  Scalar mx = -std::numeric_limits<Scalar>::infinity();
  if (whole > 0) {
    Packet m = ploadu<Packet>(x);
    for (int64_t j = L; j < whole; j += L) m = pmax(m, ploadu<Packet>(x + j));
    mx = eigen::max_of(m);
  }
  for (int64_t j = whole; j < n; ++j) mx = std::max(mx, x[j]);
  const Packet pmx = pset1<Packet>(mx), pscale = pset1<Packet>(scale);
  Packet sum = pset1<Packet>(0.0f);
  for (int64_t j = 0; j < whole; j += L) {
    const Packet e = eigen::exp(pmul(psub(ploadu<Packet>(x + j), pmx), pscale));
    pstoreu(x + j, e);
    sum = padd(sum, e);
  }
  Scalar total = eigen::sum(sum);
  for (int64_t j = whole; j < n; ++j) total += (x[j] = vec::exp_scalar((x[j] - mx) * scale));
  const Scalar inv = 1.0f / total;
  const Packet pinv = pset1<Packet>(inv);
  for (int64_t j = 0; j < whole; j += L) pstoreu(x + j, pmul(ploadu<Packet>(x + j), pinv));
  for (int64_t j = whole; j < n; ++j) x[j] *= inv;
}

}  // namespace

void causal_attention_forward(const Scalar* qkv, Scalar* y, Scalar* probs, const Scalar* keep,
                              const AttentionShape& s) {
  const profile::Scope timed("attention");
  const int64_t C = s.H * s.D, T = s.T, D = s.D;
  const Scalar scale = 1.0f / std::sqrt(static_cast<Scalar>(D));
  parallel::parallel_for(s.B * s.H, 1, [&](int64_t w0, int64_t w1) {
    std::vector<Scalar> kt(static_cast<size_t>(D * T));  // K^T (D, T)
    std::vector<Scalar> pk(keep ? static_cast<size_t>(kRowBlock * T) : 0);  // P * keep, one row block
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / s.H, h = w % s.H;
      const Scalar* q = qkv + b * T * 3 * C + h * D;  // (T, D), rows 3C apart
      const Scalar* v = q + 2 * C;                     // (T, D), rows 3C apart
      Scalar* p = probs + w * T * T;                   // (T, T)
      Scalar* o = y + b * T * C + h * D;               // (T, D), rows C apart
      transpose_head(q + C, 3 * C, T, D, kt.data());
      for (int64_t r0 = 0; r0 < T; r0 += kRowBlock) {
        const int64_t r1 = std::min(T, r0 + kRowBlock), n = r1 - r0;
        // Scores of rows [r0, r1) against keys [0, r1): (n, r1) in p.
        product(q + r0 * 3 * C, 3 * C, 1, n, D, kt.data(), T, r1, p + r0 * T, T);
        for (int64_t i = r0; i < r1; ++i) {
          // Row i sees keys 0..i: it always holds its own diagonal, so it is
          // never empty; the future is exactly 0 after the softmax.
          const int64_t width = std::min(r1, (i + eigen::kPacketSize) / eigen::kPacketSize * eigen::kPacketSize);
          causal_softmax_row(p + i * T, i + 1, width, scale);
          std::fill(p + i * T + i + 1, p + (i + 1) * T, 0.0f);
        }
        const Scalar* pb = p + r0 * T;
        if (keep) {
          eigen::array(pk.data(), n * T) = eigen::array(pb, n * T) * eigen::array(keep + w * T * T + r0 * T, n * T);
          pb = pk.data();
        }
        product(pb, T, 1, n, r1, v, 3 * C, D, o + r0 * C, C);  // O rows = P~ V
      }
    }
  });
}

void causal_attention_rows(const Scalar* qkv, const int64_t* rows, int64_t R, Scalar* y_rows, const AttentionShape& s) {
  const profile::Scope timed("attention");
  const int64_t C = s.H * s.D, T = s.T, D = s.D;
  const Scalar scale = 1.0f / std::sqrt(static_cast<Scalar>(D));
  for (int64_t r = 0; r < R; ++r)
    TAPEFORMER_CHECK(rows[r] >= 0 && rows[r] < s.B * T && (r == 0 || rows[r] > rows[r - 1]),
                     "causal_attention_rows: row ", rows[r], " of ", s.B * T, " is out of range or out of order");
  // A (b, h) pair is worth a task when its rows hold some work (a token's
  // last layers may run one row): about 2^16 multiply-adds.
  const int64_t work = std::max<int64_t>(1, R * T * D * 2 / std::max<int64_t>(1, s.B));
  parallel::parallel_for(s.B * s.H, std::max<int64_t>(1, (int64_t{1} << 16) / work), [&](int64_t w0, int64_t w1) {
    std::vector<Scalar> kt(static_cast<size_t>(D * T));             // K^T (D, T)
    std::vector<Scalar> qb(static_cast<size_t>(kRowBlock * D));     // a block's chosen queries (n, D)
    std::vector<Scalar> p(static_cast<size_t>(kRowBlock * T));      // their probabilities (n, r1), rows T apart
    std::vector<Scalar> ob(static_cast<size_t>(kRowBlock * D));     // their outputs (n, D)
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / s.H, h = w % s.H;
      const int64_t* first = std::lower_bound(rows, rows + R, b * T);
      const int64_t* last = std::lower_bound(first, rows + R, (b + 1) * T);
      if (first == last) continue;
      const Scalar* q = qkv + b * T * 3 * C + h * D;  // (T, D), rows 3C apart
      const Scalar* v = q + 2 * C;                     // (T, D), rows 3C apart
      // Keys up to the last row's block end: as far as the whole forward reads for it.
      const int64_t keys = std::min(T, ((last[-1] - b * T) / kRowBlock + 1) * kRowBlock);
      transpose_head(q + C, 3 * C, keys, D, kt.data());
      // The chosen rows of each row block together, as the whole forward runs
      // that block: scores against the block's keys [0, r1), the same softmax
      // widths, P V over [0, r1). A product's row does not depend on the others.
      for (const int64_t* g = first; g != last;) {
        const int64_t r0 = (*g - b * T) / kRowBlock * kRowBlock, r1 = std::min(T, r0 + kRowBlock);
        const int64_t* end = g;
        while (end != last && *end - b * T < r1) ++end;
        const int64_t n = end - g;
        for (int64_t j = 0; j < n; ++j) std::copy_n(q + (g[j] - b * T) * 3 * C, D, qb.data() + j * D);
        product(qb.data(), D, 1, n, D, kt.data(), keys, r1, p.data(), T);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t i = g[j] - b * T;
          const int64_t width = std::min(r1, (i + eigen::kPacketSize) / eigen::kPacketSize * eigen::kPacketSize);
          causal_softmax_row(p.data() + j * T, i + 1, width, scale);
          std::fill(p.data() + j * T + i + 1, p.data() + j * T + r1, 0.0f);
        }
        product(p.data(), T, 1, n, r1, v, 3 * C, D, ob.data(), D);
        for (int64_t j = 0; j < n; ++j) std::copy_n(ob.data() + j * D, D, y_rows + (g - rows + j) * C + h * D);
        g = end;
      }
    }
  });
}

void causal_attention_backward(const Scalar* qkv, const Scalar* probs, const Scalar* keep,
                               const Scalar* dy, Scalar* dqkv, const AttentionShape& s) {
  const profile::Scope timed("attention");
  const int64_t C = s.H * s.D, T = s.T, D = s.D;
  const Scalar scale = 1.0f / std::sqrt(static_cast<Scalar>(D));
  parallel::parallel_for(s.B * s.H, 1, [&](int64_t w0, int64_t w1) {
    std::vector<Scalar> vt(static_cast<size_t>(D * T));       // V^T (D, T)
    std::vector<Scalar> ds(static_cast<size_t>(T * T));       // scale * dS (T, T)
    std::vector<Scalar> pk(keep ? static_cast<size_t>(T * T) : 0);  // P * keep
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / s.H, h = w % s.H;
      const Scalar* q = qkv + b * T * 3 * C + h * D;  // (T, D) each, rows 3C apart
      const Scalar* k = q + C;
      Scalar* dq = dqkv + b * T * 3 * C + h * D;
      Scalar* dk = dq + C;
      Scalar* dv = dq + 2 * C;
      const Scalar* p = probs + w * T * T;               // (T, T)
      const Scalar* dout = dy + b * T * C + h * D;       // (T, D), rows C apart
      transpose_head(q + 2 * C, 3 * C, T, D, vt.data());
      const Scalar* pv = p;  // the probabilities V was multiplied by
      if (keep) {
        eigen::array(pk.data(), T * T) = eigen::array(p, T * T) * eigen::array(keep + w * T * T, T * T);
        pv = pk.data();
      }
      // Per query-row block: dP~ = dO V^T, dP = dP~ * keep,
      // dS = P * (dP - rowsum(P * dP)), dQ = scale dS K. Entries right of
      // the block's last key are 0 in ds (P is 0 there).
      for (int64_t r0 = 0; r0 < T; r0 += kRowBlock) {
        const int64_t r1 = std::min(T, r0 + kRowBlock), n = r1 - r0;
        Scalar* db = ds.data() + r0 * T;
        product(dout + r0 * C, C, 1, n, D, vt.data(), T, r1, db, T);
        for (int64_t i = 0; i < n; ++i) {
          auto dpi = eigen::array(db + i * T, r1);
          const auto pi = eigen::array(p + (r0 + i) * T, r1);
          if (keep) dpi *= eigen::array(keep + w * T * T + (r0 + i) * T, r1);
          const Scalar row_dot = vec::dot(p + (r0 + i) * T, db + i * T, r1);
          dpi = pi * (dpi - row_dot) * scale;
          std::fill(db + i * T + r1, db + (i + 1) * T, 0.0f);
        }
        product(db, T, 1, n, r1, k, 3 * C, D, dq + r0 * 3 * C, 3 * C);
      }
      // Per key block [c0, c1): only queries i >= c0 attend to it.
      // dV = P~^T dO and dK = scale dS^T Q, reading the transposes as strides.
      for (int64_t c0 = 0; c0 < T; c0 += kRowBlock) {
        const int64_t c1 = std::min(T, c0 + kRowBlock), n = c1 - c0, rows = T - c0;
        product(pv + c0 * T + c0, 1, T, n, rows, dout + c0 * C, C, D, dv + c0 * 3 * C, 3 * C);
        product(ds.data() + c0 * T + c0, 1, T, n, rows, q + c0 * 3 * C, 3 * C, D, dk + c0 * 3 * C, 3 * C);
      }
    }
  });
}

}  // namespace tapeformer::kernels
