#include "tapeformer/core/kernels/flash_attention.h"

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
#include "tapeformer/core/rng.h"
#include "tapeformer/core/shape.h"
#include "tapeformer/core/profile.h"

namespace tapeformer::kernels {
namespace {

using eigen::Packet;
constexpr int64_t kLanes = eigen::kPacketSize;
// Query rows and keys per tile: a 64 x 64 score tile (16 KiB), its dP twin
// and the K^T / V^T tiles stay in L1 / L2 while the GEMMs reuse them.
constexpr int64_t kTile = kAttentionTile;
// Rows per group on a tile the causal diagonal crosses: each group stops at
// the last key its last row sees, so the masked triangle costs 10/16 of the
// tile instead of all of it. A partial tile of the block mask is grouped the same
// way, each group over the keys its rows see.
constexpr int64_t kGroup = 16;
static_assert(kTile % kGroup == 0 && kTile % kLanes == 0, "tiles hold whole groups and whole packets");
constexpr Scalar kInf = std::numeric_limits<Scalar>::infinity();

int64_t round_up(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// C (M x N, row stride ldc) (+)= A B through the packet GEMM, with
// A(i, k) = a[i * a_rs + k * a_cs] and B (K x N) by rows of stride ldb.
void product(const Scalar* a, int64_t a_rs, int64_t a_cs, int64_t M, int64_t K, const Scalar* b, int64_t ldb, int64_t N,
             Scalar* c, int64_t ldc, bool accumulate) {
  gemm({a, M, K, a_rs, a_cs}, {b, K, N, ldb, 1}, c, ldc, accumulate);
}

// dst (cols, rows; rows kTile apart) = src^T for rows x cols at src with rows
// `ld` apart: the packet GEMM reads its B operand by rows, so Q K^T and
// dY V^T need K^T and V^T tiles.
void transpose_tile(const Scalar* src, int64_t ld, int64_t rows, int64_t cols, Scalar* dst) {
  strided_copy(src, Strides{1, ld}, dst, Strides{kTile, 1}, Shape{cols, rows});
}

// e^(k x - shift), exactly 0 where x = -inf: Eigen's exp may return a
// denormal there, and a masked key must contribute nothing, bit for bit.
inline Packet exp_shifted(const Packet& x, const Packet& k, const Packet& shift) {
  using namespace Eigen::internal;
  const Packet e = eigen::exp(pmadd(x, k, pnegate(shift)));
  return pselect(pcmp_eq(x, pset1<Packet>(-kInf)), pset1<Packet>(0.0f), e);
}

// out[0, n) = a x[0, n) (in place when out == x). Rows are short (D, or at
// most a tile): packet loops, because Eigen's setup per expression on short
// dynamic maps costs as much as the work.
void scale_row(const Scalar* x, int64_t n, Scalar a, Scalar* out) {
  using namespace Eigen::internal;
  const Packet pa = pset1<Packet>(a);
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t c = std::min(kLanes, n - j);
    eigen::store_upto(out + j, pmul(eigen::load_upto(x + j, c), pa), c);
  }
}

// The operands of one (b, h), and where its rows sit for the modifiers:
// the call's row t is row base + step t of head h of the attention (Placement).
struct Head {
  int64_t bh = 0;
  const Scalar *q = nullptr, *k = nullptr, *v = nullptr;  // (Tq, D), (Tk, D), (Tk, Dv)
  int64_t qs = 0, ks = 0, vs = 0;                         // their row strides
  int64_t b = 0, h = 0, base = 0, step = 1;               // in the attention's coordinates
  int64_t Tq = 0, Tk = 0;                                 // the attention's lengths

  void set(const FlashAttention& a, int64_t bh_) {
    bh = bh_;
    const int64_t c = bh % a.s.H;
    b = bh / a.s.H;
    q = a.q.data + b * a.q.sb + c * a.q.sh, qs = a.q.st;
    k = a.k.data + b * a.k.sb + c * a.k.sh, ks = a.k.st;
    v = a.v.data + b * a.v.sb + c * a.v.sh, vs = a.v.st;
    const Placement& p = a.place;
    h = p.period > 0 ? p.h0 : p.h0 + c;
    base = p.period > 0 ? p.c0 + c : 0;
    step = p.period > 0 ? p.period : 1;
    Tq = p.Tq >= 0 ? p.Tq : a.s.Tq;
    Tk = p.Tk >= 0 ? p.Tk : a.s.Tk;
  }
  // Query row i against keys j0 + [0, n) of the call, for the modifiers.
  ScoreRow row(int64_t i, int64_t j0, int64_t n) const {
    return {b, h, base + step * i, base + step * j0, step, n, Tq, Tk};
  }
};

template <class View>
auto row_of(const View& x, const FlashAttentionShape& s, int64_t bh, int64_t t) {
  return x.data + bh / s.H * x.sb + bh % s.H * x.sh + t * x.st;
}

// Per-thread tile buffers (O(kTile * (kTile + D)), never O(T)), 64-byte
// aligned like a Storage: every work item sees its rows at the same alignment
// (the row code is also written not to depend on it).
using Buffer = std::vector<Scalar, Eigen::aligned_allocator<Scalar>>;
struct Workspace {
  Workspace(const FlashAttentionShape& s, size_t maps)
      : kt(s.D * kTile),
        vt(s.Dv * kTile),
        s(kTile * kTile),
        dp(kTile * kTile),
        acc_q(kTile * s.D),
        acc_k(kTile * s.D),
        acc_v(kTile * s.Dv),
        m(kTile),
        l(kTile * kLanes),
        bias(kTile),
        keep(kTile),
        ds(kTile),
        map_in(kTile * maps) {}
  Buffer kt, vt;               // K^T (D, kTile), V^T (Dv, kTile) of one key tile
  Buffer s, dp;                // (kTile, kTile): scores -> P~, and dP~ -> scale dS
  Buffer acc_q, acc_k, acc_v;  // (kTile, D), (kTile, D), (kTile, Dv): O or dq, dk, dv
  Buffer m, l;                 // running row max, and (kTile, kLanes) partial sums, of the forward
  Buffer bias, keep;           // one row's summed terms and dropout factors
  Buffer ds, map_in;           // one row's dS, and its scores as each map received them (maps, kTile)
  Head head;
};

// Keys [0, key_end) are visible to some query row before `row_end`.
int64_t key_end(const FlashAttention& a, int64_t row_end) {
  return a.causal ? std::min(a.s.Tk, a.s.Tk - a.s.Tq + row_end) : a.s.Tk;
}

// Number of keys in [j0, j0 + nk) that query i sees.
int64_t visible(const FlashAttention& a, int64_t i, int64_t j0, int64_t nk) {
  return a.causal ? std::clamp<int64_t>(a.s.Tk - a.s.Tq + i + 1 - j0, 0, nk) : nk;
}

// The keys a tile pair computes: [j0, j0 + nk), column c0 of its key tile
// onwards. A block-mask entry covers only the columns some row sees (a key tile
// whose first half no query sees costs half a tile); dense, the whole tile.
struct KeyRange {
  int64_t j0, nk, entry, c0;
};
KeyRange range_of(const FlashAttention& a, int64_t u, int64_t entry) {
  if (entry < 0) return {u * kTile, std::min(kTile, a.s.Tk - u * kTile), -1, 0};
  const BlockMask& p = *a.blocks;
  const int64_t c0 = p.col_lo[entry];
  return {u * kTile + c0, p.col_hi[entry] - c0, entry, c0};
}

// Calls fn(range) for the key tiles query tile `qt` computes, in order: with a
// block mask its listed tiles, else every tile that starts before `kend`. A
// range at or past kend (wholly in the causal future) is skipped either way.
template <class F>
void for_each_key_tile(const FlashAttention& a, int64_t qt, int64_t kend, F&& fn) {
  if (a.blocks == nullptr) {
    for (int64_t j0 = 0; j0 < kend; j0 += kTile) fn(range_of(a, j0 / kTile, -1));
    return;
  }
  const BlockMask& p = *a.blocks;
  for (int64_t e = p.row_start[qt]; e < p.row_start[qt + 1]; ++e) {
    const KeyRange sp = range_of(a, p.key_tile[e], e);
    if (sp.j0 < kend) fn(sp);
  }
}

// Masks row r of a key range: scores of keys its block-mask entry hides become
// -inf (exactly zero probability, as with a -inf term).
void mask_row(const FlashAttention& a, const KeyRange& sp, int64_t r, Scalar* row, int64_t vis) {
  if (sp.entry < 0) return;
  const int32_t m = a.blocks->mask_of[sp.entry];
  if (m < 0) return;
  const uint8_t* seen = a.blocks->masks.data() + (int64_t{m} * kTile + r) * kTile + sp.c0;
  for (int64_t j = 0; j < vis; ++j)
    if (!seen[j]) row[j] = -kInf;
}

// Calls fn(r0, r1, g) for the row groups of key range sp against query rows
// i0 + [0, n), g the keys the group computes (a part of sp): the whole range
// when every row sees every key and no mask applies; else kGroup-row groups,
// each from the first key a row of the group sees (by its mask) to the last
// its last row may see (causal) or any row sees (mask). Groups that see no
// key are skipped.
template <class F>
void for_each_group(const FlashAttention& a, int64_t i0, int64_t n, const KeyRange& sp, F&& fn) {
  const uint8_t* mask = sp.entry >= 0 && a.blocks->mask_of[sp.entry] >= 0
                            ? a.blocks->masks.data() + int64_t{a.blocks->mask_of[sp.entry]} * kTile * kTile + sp.c0
                            : nullptr;  // row r of the range: mask[r * kTile + j], j < sp.nk
  if (mask == nullptr && visible(a, i0, sp.j0, sp.nk) == sp.nk) {
    fn(int64_t{0}, n, sp);
    return;
  }
  for (int64_t r0 = 0; r0 < n; r0 += kGroup) {
    const int64_t r1 = std::min(n, r0 + kGroup);
    int64_t lo = 0, hi = visible(a, i0 + r1 - 1, sp.j0, sp.nk);
    if (mask != nullptr) {
      int64_t first = hi, last = 0;
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* m = mask + r * kTile;
        for (int64_t j = 0; j < first; ++j)
          if (m[j]) {
            first = j;
            break;
          }
        for (int64_t j = hi; j > last; --j)
          if (m[j - 1]) {
            last = j;
            break;
          }
      }
      lo = first, hi = last;
    }
    if (hi > lo) fn(r0, r1, KeyRange{sp.j0 + lo, hi - lo, sp.entry, sp.c0 + lo});
  }
}

// Row i's scores against keys j0 + [0, vis): s holds q_i . k_j and becomes
// x with score = k x, and -inf in [vis, w) so the row runs in whole packets.
// Without terms x stays q_i . k_j and k = scale (the exp's multiply-add
// applies it); with terms x = scale q_i . k_j + sum_t term_t (terms summed
// first, in order) and k = 1. Returns k. `sum` is scratch for the terms.
Scalar score_row(const FlashAttention& a, const ScoreRow& row, Scalar* s, int64_t w, Scalar scale, Scalar* sum) {
  const int64_t vis = row.n;
  std::fill(s + vis, s + w, -kInf);
  if (a.mods.terms.empty()) return scale;
  std::fill(sum, sum + vis, 0.0f);
  for (const ScoreTerm* t : a.mods.terms) t->add(row, sum);
  // s = scale s + sum as one multiply-add per lane: Eigen's loop over a map
  // peels its unaligned head to scalar code that may round differently, and
  // results must not depend on where a work item's buffers happen to lie.
  const Packet pscale = Eigen::internal::pset1<Packet>(scale);
  for (int64_t j = 0; j < vis; j += kLanes) {
    const int64_t c = std::min(kLanes, vis - j);
    eigen::store_upto(s + j, Eigen::internal::pmadd(eigen::load_upto(s + j, c), pscale, eigen::load_upto(sum + j, c)),
                      c);
  }
  return 1.0f;
}

// The maps in order on row[0, vis) (row holds true scores: k = 1), each
// map's input kept in ws.map_in for the backward; a -inf score stays -inf.
void map_row(const FlashAttention& a, Workspace& ws, const ScoreRow& row, Scalar* s) {
  for (size_t m = 0; m < a.mods.maps.size(); ++m) {
    Scalar* in = ws.map_in.data() + m * kTile;
    std::copy(s, s + row.n, in);
    a.mods.maps[m]->apply(row, s);
    for (int64_t x = 0; x < row.n; ++x)
      if (in[x] == -kInf) s[x] = -kInf;
  }
}

// Row i's dropout factors for keys j0 + [0, vis): 1 / (1 - p) where kept, else 0.
void keep_row(const FlashAttention& a, int64_t bh, int64_t i, int64_t j0, int64_t vis, Scalar* keep) {
  const uint64_t base = static_cast<uint64_t>((bh * a.s.Tq + i) * a.s.Tk + j0);
  const Scalar p = a.dropout_p, inv = 1.0f / (1.0f - p);
  for (int64_t j = 0; j < vis; ++j) keep[j] = hash_uniform(a.seed, base + j) >= p ? inv : 0.0f;
}

// Every modifier of query row i (row r of key range sp) against keys
// sp.j0 + [0, vis), in one place for the forward and the backward's
// recompute: the terms (score_row; row[vis, w) becomes -inf), the maps, the
// block mask's tile mask and the masks; with dropout, *keep points at the
// row's keep factors (zero in [vis, w)). Returns the k of score = k row.
Scalar row_terms(const FlashAttention& a, Workspace& ws, const KeyRange& sp, int64_t r, int64_t i, int64_t vis, int64_t w,
                 Scalar scale, Scalar* row, const Scalar** keep) {
  Scalar k = scale;
  if (a.mods.empty()) {
    std::fill(row + vis, row + w, -kInf);
  } else {
    const ScoreRow sr = ws.head.row(i, sp.j0, vis);
    k = score_row(a, sr, row, w, scale, ws.bias.data());
    if (!a.mods.maps.empty()) {
      if (k != 1.0f) scale_row(row, vis, k, row), k = 1.0f;
      map_row(a, ws, sr, row);
    }
    for (const ScoreMask* m : a.mods.masks) m->apply(sr, row);
  }
  mask_row(a, sp, r, row, vis);
  *keep = nullptr;
  if (a.dropout_p > 0) {
    keep_row(a, ws.head.bh, i, sp.j0, vis, ws.keep.data());
    std::fill(ws.keep.begin() + vis, ws.keep.begin() + w, 0.0f);
    *keep = ws.keep.data();
  }
  return k;
}

// One online-softmax step on a row of scores k x[0, w) (k > 0):
// x <- e^(k x - m_new), l <- l e^(m - m_new) + sum(x), m <- m_new = max(m, k max x).
// l is one packet of partial sums, added across lanes once at the end of the
// row (a horizontal add per tile costs as much as the exps of a short row).
// Returns the factor e^(m - m_new) for what the row accumulated so far (1
// while it has nothing). A row with no finite score yet stays at m = -inf,
// l = 0 and contributes zeros.
Scalar online_row(Scalar* x, int64_t w, Scalar k, Scalar& m, Scalar* l) {
  using namespace Eigen::internal;
  Packet mx = pset1<Packet>(-kInf);
  for (int64_t j = 0; j < w; j += kLanes) mx = pmax(mx, ploadu<Packet>(x + j));
  const Scalar m_new = std::max(m, k * eigen::max_of(mx));
  if (m_new == -kInf) {
    std::fill(x, x + w, 0.0f);
    return 1.0f;
  }
  const Packet pk = pset1<Packet>(k), shift = pset1<Packet>(m_new);
  Packet sum = pset1<Packet>(0.0f);
  for (int64_t j = 0; j < w; j += kLanes) {
    const Packet e = exp_shifted(ploadu<Packet>(x + j), pk, shift);
    pstoreu(x + j, e);
    sum = padd(sum, e);
  }
  const Scalar alpha = m == -kInf ? 1.0f : std::exp(m - m_new);
  pstoreu(l, pmadd(ploadu<Packet>(l), pset1<Packet>(alpha), sum));
  m = m_new;
  return alpha;
}

// One row of the backward from its scores k s[0, w) and dP~ = dy . v_j in
// dp[0, w): P = e^(k s - lse), s <- P~ = P keep (for dv),
// dp <- scale P (dP~ keep - delta) (for dq and dk). keep is null without dropout.
void backward_row(Scalar* s, Scalar* dp, int64_t w, Scalar k, Scalar lse, Scalar delta, Scalar scale,
                  const Scalar* keep) {
  using namespace Eigen::internal;
  if (lse == kInf) {  // no visible key: y = 0, no gradient
    std::fill(s, s + w, 0.0f);
    std::fill(dp, dp + w, 0.0f);
    return;
  }
  const Packet pk = pset1<Packet>(k), shift = pset1<Packet>(lse), pdelta = pset1<Packet>(delta),
               pscale = pset1<Packet>(scale);
  for (int64_t j = 0; j < w; j += kLanes) {
    Packet p = exp_shifted(ploadu<Packet>(s + j), pk, shift);
    Packet d = ploadu<Packet>(dp + j);
    pstoreu(dp + j, pmul(pmul(p, psub(keep ? pmul(d, ploadu<Packet>(keep + j)) : d, pdelta)), pscale));
    if (keep) p = pmul(p, ploadu<Packet>(keep + j));
    pstoreu(s + j, p);
  }
}

// The key row (of the call) whose value query row i takes when it sees no
// key: the first mask's fallback, or -1.
int64_t fallback_key(const FlashAttention& a, const Head& hd, int64_t i) {
  const ScoreRow r = hd.row(i, 0, 0);
  for (const ScoreMask* m : a.mods.masks) {
    const int64_t j = m->fallback(r.b, r.h, r.i);
    if (j >= 0) return (j - hd.base) / hd.step;
  }
  return -1;
}

// ---- forward -------------------------------------------------------------

void forward_tile(const FlashAttention& a, Workspace& ws, int64_t i0, HeadOut y, Scalar* lse) {
  const FlashAttentionShape& s = a.s;
  const Head& hd = ws.head;
  const Scalar scale = 1.0f / std::sqrt(static_cast<Scalar>(s.D));
  const int64_t n = std::min(kTile, s.Tq - i0), kend = key_end(a, i0 + n);
  const Scalar* q = hd.q + i0 * hd.qs;  // (n, D)
  Scalar* o = ws.acc_v.data();          // (n, Dv): unnormalised output
  std::fill(ws.m.begin(), ws.m.end(), -kInf);
  std::fill(ws.l.begin(), ws.l.end(), 0.0f);
  std::fill(o, o + n * s.Dv, 0.0f);
  for_each_key_tile(a, i0 / kTile, kend, [&](const KeyRange& sp) {
    const int64_t j0 = sp.j0, nk = sp.nk;
    transpose_tile(hd.k + j0 * hd.ks, hd.ks, nk, s.D, ws.kt.data());
    for_each_group(a, i0, n, sp, [&](int64_t r0, int64_t r1, const KeyRange& g) {
      const int64_t w = round_up(g.nk);
      product(q + r0 * hd.qs, hd.qs, 1, r1 - r0, s.D, ws.kt.data() + (g.j0 - j0), kTile, g.nk,
              ws.s.data() + r0 * kTile, kTile, false);
      for (int64_t r = r0; r < r1; ++r) {
        Scalar* row = ws.s.data() + r * kTile;
        const int64_t i = i0 + r, vis = visible(a, i, g.j0, g.nk);
        const Scalar* keep = nullptr;
        const Scalar k = row_terms(a, ws, g, r, i, vis, w, scale, row, &keep);
        const Scalar alpha = online_row(row, w, k, ws.m[r], ws.l.data() + r * kLanes);
        if (alpha != 1.0f) scale_row(o + r * s.Dv, s.Dv, alpha, o + r * s.Dv);
        if (keep != nullptr)
          for (int64_t j = 0; j < vis; ++j) row[j] *= keep[j];
      }
      product(ws.s.data() + r0 * kTile, kTile, 1, r1 - r0, g.nk, hd.v + g.j0 * hd.vs, hd.vs, s.Dv, o + r0 * s.Dv,
              s.Dv, true);
    });
  });
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = i0 + r;
    const Scalar l = eigen::sum(Eigen::internal::ploadu<Packet>(ws.l.data() + r * kLanes));
    const bool seen = l > 0;
    const int64_t fb = seen ? -1 : fallback_key(a, hd, i);
    if (fb >= 0) {  // sees no key: takes its fallback key's value
      std::copy_n(hd.v + fb * hd.vs, s.Dv, row_of(y, s, hd.bh, i));
      lse[hd.bh * s.Tq + i] = kFallbackScore;
      continue;
    }
    scale_row(o + r * s.Dv, s.Dv, seen ? 1.0f / l : 0.0f, row_of(y, s, hd.bh, i));
    lse[hd.bh * s.Tq + i] = seen ? ws.m[r] + std::log(l) : kInf;
  }
}

// ---- backward ------------------------------------------------------------

struct Grads {
  HeadView y, dy;
  const Scalar* lse;    // (B, H, Tq)
  const Scalar* delta;  // (B, H, Tq): dy_i . y_i
  HeadOut dq, dk, dv;
  // Per modifier (the terms, then the maps): the partial gradients of a
  // learned one whose gradient is wanted, (B H, query tiles, partial_size), or null.
  std::vector<Scalar*> parts;
  bool learned = false;  // any part
};

// After backward_row on row r (query i, keys j0 + [0, vis)): dS taken back
// through the maps (ws.dp holds scale dS), and with `learn` the learned
// modifiers' partial gradients of the query tile at i0, from dS at each
// modifier's output.
void modifiers_backward(const FlashAttention& a, Workspace& ws, const Grads& g, int64_t i0, int64_t r, int64_t i,
                        int64_t j0, int64_t vis, Scalar scale, bool learn) {
  const ScoreMods& mods = a.mods;
  learn = learn && g.learned;
  if (mods.maps.empty() && !learn) return;
  const FlashAttentionShape& s = a.s;
  const Head& hd = ws.head;
  const ScoreRow sr = hd.row(i, j0, vis);
  const int64_t tile = hd.bh * ((s.Tq + kTile - 1) / kTile) + i0 / kTile;
  const auto part = [&](size_t m, const LearnedModifier& mod) {
    return learn && g.parts[m] ? g.parts[m] + tile * mod.partial_size() : nullptr;
  };
  Scalar* dp = ws.dp.data() + r * kTile;
  Scalar* ds = ws.ds.data();
  const Scalar inv_scale = std::sqrt(static_cast<Scalar>(s.D));
  for (int64_t x = 0; x < vis; ++x) ds[x] = dp[x] * inv_scale;
  const size_t nt = mods.terms.size();
  if (!mods.maps.empty()) {
    for (size_t m = mods.maps.size(); m-- > 0;) {
      const Scalar* in = ws.map_in.data() + m * kTile;
      mods.maps[m]->backward(sr, in, ds, part(nt + m, *mods.maps[m]));
      for (int64_t x = 0; x < vis; ++x)
        if (in[x] == -kInf) ds[x] = 0.0f;
    }
    for (int64_t x = 0; x < vis; ++x) dp[x] = ds[x] * scale;
  }
  for (size_t t = 0; t < nt; ++t)
    if (Scalar* pt = part(t, *mods.terms[t])) mods.terms[t]->add_gradient(sr, ds, pt);
}

// Recomputes rows [r0, r1) of query rows i0 + .. against the group's keys
// sp (sp.j0 + [0, sp.nk)) into ws.s (P~) and ws.dp (scale dS). kt, vt hold
// the loaded key tile, sp.j0 at their column `col`. With `learn` (once per
// pair: the dq pass), the learned modifiers' partial gradients too.
void recompute_group(const FlashAttention& a, Workspace& ws, const Grads& g, int64_t i0, int64_t r0, int64_t r1,
                     const KeyRange& sp, int64_t col, bool learn) {
  const int64_t j0 = sp.j0, nk_g = sp.nk;
  const FlashAttentionShape& s = a.s;
  const Head& hd = ws.head;
  const Scalar scale = 1.0f / std::sqrt(static_cast<Scalar>(s.D));
  const int64_t w = round_up(nk_g), rows = r1 - r0;
  Scalar* sg = ws.s.data() + r0 * kTile;
  Scalar* dpg = ws.dp.data() + r0 * kTile;
  product(hd.q + (i0 + r0) * hd.qs, hd.qs, 1, rows, s.D, ws.kt.data() + col, kTile, nk_g, sg, kTile, false);
  product(row_of(g.dy, s, hd.bh, i0 + r0), g.dy.st, 1, rows, s.Dv, ws.vt.data() + col, kTile, nk_g, dpg, kTile,
          false);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t i = i0 + r, vis = visible(a, i, j0, nk_g);
    Scalar* row = ws.s.data() + r * kTile;
    const Scalar* keep = nullptr;
    const Scalar k = row_terms(a, ws, sp, r, i, vis, w, scale, row, &keep);
    backward_row(row, ws.dp.data() + r * kTile, w, k, g.lse[hd.bh * s.Tq + i], g.delta[hd.bh * s.Tq + i], scale, keep);
    modifiers_backward(a, ws, g, i0, r, i, j0, vis, scale, learn);
  }
}

void load_key_tile(const FlashAttention& a, Workspace& ws, int64_t j0, int64_t nk) {
  const Head& hd = ws.head;
  transpose_tile(hd.k + j0 * hd.ks, hd.ks, nk, a.s.D, ws.kt.data());
  transpose_tile(hd.v + j0 * hd.vs, hd.vs, nk, a.s.Dv, ws.vt.data());
}

// acc (rows, cols) -> rows t0 + [0, rows) of out at (b, h).
void store_rows(const Scalar* acc, int64_t rows, int64_t cols, const HeadOut& out, const FlashAttentionShape& s,
                int64_t bh, int64_t t0) {
  if (!out.data) return;
  for (int64_t r = 0; r < rows; ++r) std::copy(acc + r * cols, acc + (r + 1) * cols, row_of(out, s, bh, t0 + r));
}

// Per key group: dv[c0, c0 + nk_g) += P~^T dY, dk[c0, c0 + nk_g) += scale dS^T Q over rows [r0, r1)
// (c0: the range's first column in its key tile).
void accumulate_dkv(const FlashAttention& a, Workspace& ws, const Grads& g, int64_t i0, int64_t r0, int64_t r1,
                    int64_t nk_g, int64_t c0) {
  const FlashAttentionShape& s = a.s;
  const Head& hd = ws.head;
  const int64_t rows = r1 - r0;
  product(ws.s.data() + r0 * kTile, 1, kTile, nk_g, rows, row_of(g.dy, s, hd.bh, i0 + r0), g.dy.st, s.Dv,
          ws.acc_v.data() + c0 * s.Dv, s.Dv, true);
  product(ws.dp.data() + r0 * kTile, 1, kTile, nk_g, rows, hd.q + (i0 + r0) * hd.qs, hd.qs, s.D,
          ws.acc_k.data() + c0 * s.D, s.D, true);
}

// dq for query rows i0 + [0, n): sum over key tiles of scale dS K.
void dq_tile(const FlashAttention& a, Workspace& ws, const Grads& g, int64_t i0) {
  const FlashAttentionShape& s = a.s;
  const Head& hd = ws.head;
  const int64_t n = std::min(kTile, s.Tq - i0), kend = key_end(a, i0 + n);
  std::fill(ws.acc_q.begin(), ws.acc_q.begin() + n * s.D, 0.0f);
  for_each_key_tile(a, i0 / kTile, kend, [&](const KeyRange& sp) {
    const int64_t j0 = sp.j0, nk = sp.nk;
    load_key_tile(a, ws, j0, nk);
    for_each_group(a, i0, n, sp, [&](int64_t r0, int64_t r1, const KeyRange& gs) {
      recompute_group(a, ws, g, i0, r0, r1, gs, gs.j0 - j0, /*learn=*/true);
      product(ws.dp.data() + r0 * kTile, kTile, 1, r1 - r0, gs.nk, hd.k + gs.j0 * hd.ks, hd.ks, s.D,
              ws.acc_q.data() + r0 * s.D, s.D, true);
    });
  });
  store_rows(ws.acc_q.data(), n, s.D, g.dq, s, hd.bh, i0);
}

// dk, dv for keys j0 + [0, nk): sums over the query tiles that see them.
void dkv_tile(const FlashAttention& a, Workspace& ws, const Grads& g, int64_t j0) {
  const FlashAttentionShape& s = a.s;
  const int64_t nk = std::min(kTile, s.Tk - j0);
  std::fill(ws.acc_k.begin(), ws.acc_k.begin() + nk * s.D, 0.0f);
  std::fill(ws.acc_v.begin(), ws.acc_v.begin() + nk * s.Dv, 0.0f);
  KeyRange loaded{-1, 0, -1, 0};  // the keys in ws.kt, ws.vt
  const auto query_tile = [&](int64_t i0, const KeyRange& sp) {
    if (sp.j0 != loaded.j0 || sp.nk != loaded.nk) load_key_tile(a, ws, sp.j0, sp.nk);
    loaded = sp;
    const int64_t n = std::min(kTile, s.Tq - i0);
    for_each_group(a, i0, n, sp, [&](int64_t r0, int64_t r1, const KeyRange& gs) {
      recompute_group(a, ws, g, i0, r0, r1, gs, gs.j0 - sp.j0, /*learn=*/false);
      accumulate_dkv(a, ws, g, i0, r0, r1, gs.nk, gs.c0);
    });
  };
  const int64_t u = j0 / kTile;
  if (a.blocks == nullptr) {
    const int64_t first = a.causal ? std::max<int64_t>(0, j0 - (s.Tk - s.Tq)) : 0;  // first query that sees j0
    for (int64_t i0 = first / kTile * kTile; i0 < s.Tq; i0 += kTile) query_tile(i0, range_of(a, u, -1));
  } else {
    const BlockMask& p = *a.blocks;
    for (int64_t c = p.col_start[u]; c < p.col_start[u + 1]; ++c) {
      const int64_t e = p.col_entry[c];
      const int64_t qt = std::upper_bound(p.row_start.begin(), p.row_start.end(), e) - p.row_start.begin() - 1;
      const KeyRange sp = range_of(a, u, e);
      const int64_t first = a.causal ? std::max<int64_t>(0, sp.j0 - (s.Tk - s.Tq)) : 0;  // first query seeing it
      if ((qt + 1) * kTile > first) query_tile(qt * kTile, sp);
    }
  }
  store_rows(ws.acc_k.data(), nk, s.D, g.dk, s, ws.head.bh, j0);
  store_rows(ws.acc_v.data(), nk, s.Dv, g.dv, s, ws.head.bh, j0);
}

// A single query tile: dq, dk and dv of one (b, h) in one sweep over the key
// tiles, with the same products in the same order as dq_tile and dkv_tile.
void head_single_query_tile(const FlashAttention& a, Workspace& ws, const Grads& g) {
  const FlashAttentionShape& s = a.s;
  const Head& hd = ws.head;
  const int64_t n = s.Tq, kend = key_end(a, n);
  std::fill(ws.acc_q.begin(), ws.acc_q.begin() + n * s.D, 0.0f);
  for (int64_t j0 = 0; j0 < s.Tk; j0 += kTile) {
    const int64_t nk = std::min(kTile, s.Tk - j0);
    std::fill(ws.acc_k.begin(), ws.acc_k.begin() + nk * s.D, 0.0f);
    std::fill(ws.acc_v.begin(), ws.acc_v.begin() + nk * s.Dv, 0.0f);
    int64_t entry = -1;
    bool listed = a.blocks == nullptr;
    if (!listed) {  // is key tile j0 / kTile in query tile 0's row?
      const BlockMask& p = *a.blocks;
      const auto first = p.key_tile.begin() + p.row_start[0], last = p.key_tile.begin() + p.row_start[1];
      const auto it = std::lower_bound(first, last, static_cast<int32_t>(j0 / kTile));
      listed = it != last && *it == j0 / kTile;
      if (listed) entry = it - p.key_tile.begin();
    }
    const KeyRange sp = range_of(a, j0 / kTile, entry);
    if (sp.j0 < kend && listed) {
      load_key_tile(a, ws, sp.j0, sp.nk);
      for_each_group(a, 0, n, sp, [&](int64_t r0, int64_t r1, const KeyRange& gs) {
        recompute_group(a, ws, g, 0, r0, r1, gs, gs.j0 - sp.j0, /*learn=*/true);
        product(ws.dp.data() + r0 * kTile, kTile, 1, r1 - r0, gs.nk, hd.k + gs.j0 * hd.ks, hd.ks, s.D,
                ws.acc_q.data() + r0 * s.D, s.D, true);
        accumulate_dkv(a, ws, g, 0, r0, r1, gs.nk, gs.c0);
      });
    }
    store_rows(ws.acc_k.data(), nk, s.D, g.dk, s, hd.bh, j0);
    store_rows(ws.acc_v.data(), nk, s.Dv, g.dv, s, hd.bh, j0);
  }
  store_rows(ws.acc_q.data(), n, s.D, g.dq, s, hd.bh, 0);
}

// Calls fn(ws, tile) with ws.head at (b, h) for every (b, h) and tile below
// n_tiles, in parallel over items that each take a tile and its mirror
// n_tiles - 1 - tile: under a causal mask a tile's cost grows (query tiles)
// or falls (key tiles) linearly with its index, so the items cost about the
// same and fixed chunks of them balance.
template <class F>
void for_each_tile(const FlashAttention& a, int64_t n_tiles, F&& fn) {
  const int64_t pairs = (n_tiles + 1) / 2;
  parallel::parallel_for(a.s.B * a.s.H * pairs, 1, [&](int64_t u0, int64_t u1) {
    Workspace ws(a.s, a.mods.maps.size());
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t t = u % pairs;
      ws.head.set(a, u / pairs);
      fn(ws, t);
      if (n_tiles - 1 - t != t) fn(ws, n_tiles - 1 - t);
    }
  });
}

int64_t tiles(int64_t n) { return (n + kTile - 1) / kTile; }

void check_blocks(const FlashAttention& a) {
  if (a.blocks == nullptr) return;
  const BlockMask& p = *a.blocks;
  TAPEFORMER_CHECK(p.Tq == a.s.Tq && p.Tk == a.s.Tk, "attention: the block mask is for Tq ", p.Tq, ", Tk ", p.Tk,
                   " but the inputs have Tq ", a.s.Tq, ", Tk ", a.s.Tk);
  TAPEFORMER_CHECK(static_cast<int64_t>(p.row_start.size()) == p.q_tiles() + 1 &&
                       static_cast<int64_t>(p.col_start.size()) == p.k_tiles() + 1,
                   "attention: the block mask is unfinished (", p.row_start.size() - 1, " of ", p.q_tiles(),
                   " query tiles ended; finish() builds the key index)");
}

// Modifier m of a call: its terms, then its maps.
const LearnedModifier& modifier(const FlashAttention& a, size_t m) {
  const size_t nt = a.mods.terms.size();
  return m < nt ? static_cast<const LearnedModifier&>(*a.mods.terms[m]) : *a.mods.maps[m - nt];
}

// The modifiers' own part of the backward, after the tiles: a query that saw
// no key but its fallback key passes dy_i to that key's dv, and the learned
// modifiers' partial gradients are folded in the fixed order b, h, query tile.
void modifiers_backward_end(const FlashAttention& a, const Scalar* lse, HeadView dy, HeadOut dv, const Grads& g) {
  const FlashAttentionShape& s = a.s;
  if (!a.mods.masks.empty() && dv.data) {  // y_i = v_fallback, so dv_fallback += dy_i
    Head hd;
    for (int64_t r = 0; r < s.B * s.H * s.Tq; ++r) {
      const int64_t bh = r / s.Tq, i = r % s.Tq;
      if (lse[r] != kFallbackScore) continue;
      hd.set(a, bh);
      const int64_t fb = fallback_key(a, hd, i);
      if (fb < 0) continue;
      Scalar* out = row_of(dv, s, bh, fb);
      const Scalar* in = row_of(dy, s, bh, i);
      for (int64_t d = 0; d < s.Dv; ++d) out[d] += in[d];
    }
  }
  if (!g.learned) return;
  const int64_t q_tiles = tiles(s.Tq);
  for (size_t m = 0; m < g.parts.size(); ++m) {
    if (g.parts[m] == nullptr) continue;
    const LearnedModifier& mod = modifier(a, m);
    const int64_t size = mod.partial_size();
    Head hd;
    for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
      hd.set(a, bh);
      for (int64_t t = 0; t < q_tiles; ++t)
        mod.fold_gradient(hd.b, hd.h, g.parts[m] + (bh * q_tiles + t) * size, a.mods.grads[m]);
    }
  }
}

}  // namespace

void flash_attention_forward(const FlashAttention& a, HeadOut y, Scalar* lse) {
  const profile::Scope timed("attention");
  check_blocks(a);
  for_each_tile(a, tiles(a.s.Tq), [&](Workspace& ws, int64_t t) { forward_tile(a, ws, t * kTile, y, lse); });
}

void flash_attention_backward(const FlashAttention& a, HeadView y, const Scalar* lse, HeadView dy, HeadOut dq,
                              HeadOut dk, HeadOut dv, const Scalar* dlse) {
  const profile::Scope timed("attention");
  check_blocks(a);
  const FlashAttentionShape& s = a.s;
  // delta_i = dy_i . y_i (= sum_j P_ij dP_ij, dropout included), one per query row.
  std::vector<Scalar> delta(static_cast<size_t>(s.B * s.H * s.Tq));
  parallel::parallel_for(s.B * s.H * s.Tq, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bh = r / s.Tq, i = r % s.Tq;
      delta[r] = vec::dot(row_of(dy, s, bh, i), row_of(y, s, bh, i), s.Dv) - (dlse ? dlse[r] : 0.0f);
    }
  });
  Grads g{y, dy, lse, delta.data(), dq, dk, dv, {}, false};
  // A learned modifier's partial gradients, where its gradient is wanted.
  const size_t n_mods = a.mods.terms.size() + a.mods.maps.size();
  std::vector<std::vector<Scalar>> parts(n_mods);
  g.parts.assign(n_mods, nullptr);
  for (size_t m = 0; m < n_mods; ++m) {
    const LearnedModifier& mod = modifier(a, m);
    if (mod.partial_size() == 0 || m >= a.mods.grads.size() || a.mods.grads[m] == nullptr) continue;
    parts[m].assign(static_cast<size_t>(s.B * s.H * tiles(s.Tq) * mod.partial_size()), 0.0f);
    g.parts[m] = parts[m].data();
    g.learned = true;
  }
  if (s.Tq <= kTile) {
    for_each_tile(a, 1, [&](Workspace& ws, int64_t) { head_single_query_tile(a, ws, g); });
  } else {
    if (dq.data || g.learned)
      for_each_tile(a, tiles(s.Tq), [&](Workspace& ws, int64_t t) { dq_tile(a, ws, g, t * kTile); });
    if (dk.data || dv.data)
      for_each_tile(a, tiles(s.Tk), [&](Workspace& ws, int64_t t) { dkv_tile(a, ws, g, t * kTile); });
  }
  modifiers_backward_end(a, lse, dy, dv, g);
}

}  // namespace tapeformer::kernels
