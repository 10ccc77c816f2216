// The bf16 product on AVX512-BF16 (vdpbf16ps), blocked as the float32
// kernel's (matmul.cpp): K cut into blocks of kc pairs, A and B packed per
// block, a 6 x 64 tile of C in registers (run() says which loop order).
//
// The operands are packed as bf16 pairs, the form the instruction reads: a
// 32-bit lane holds (k = 2p, 2p + 1) of one element, the even one in the low
// half. B's column block (64 columns) becomes kc rows of 64 such lanes, A's
// 6-row tile kc steps of 6 lanes, each broadcast to a register. One
// instruction then does 32 multiply-adds where an FMA does 16, and both
// operands take half the bytes of float32.
//
// Every function that runs AVX-512 instructions carries the target attribute
// below, and only they: the file is compiled for the build's instruction
// set, so nothing it shares with other files (inline library functions,
// templates) is compiled for AVX-512, and the functions are reached only
// after bf16_unsupported() said the CPU has the instructions.
#include "tapeformer/core/kernels/matmul_bf16.h"

#include <unistd.h>

#include <algorithm>
#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/precision.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TAPEFORMER_BF16_KERNELS 1
#define TAPEFORMER_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#endif

namespace tapeformer::kernels {

#if defined(TAPEFORMER_BF16_KERNELS)

FlushDenormals::FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }  // FTZ | DAZ
FlushDenormals::~FlushDenormals() { _mm_setcsr(saved_); }

namespace {

constexpr int kLanes = 16;       // floats per register
constexpr int kTilePackets = 4;  // a tile's columns: 4 registers, 64 floats
constexpr int kTileRows = 6;     // 24 accumulators, 4 of B and a broadcast: 29 of 32 registers
constexpr int64_t kWidth = kTilePackets * kLanes;

struct Blocking {
  int64_t kc, mc, nc;  // kc in pairs of k
  int64_t l2;          // bytes
  // Rows whose C (n floats each) fills half of L2: a block of rows that
  // runs through every K block keeps its C there.
  int64_t mc_rows_per_c(int64_t n) const {
    return std::max<int64_t>(kTileRows, l2 / 2 / (std::max<int64_t>(n, 1) * 4) / kTileRows * kTileRows);
  }
};

int64_t cache_bytes(int name, int64_t fallback) {
  const long v = sysconf(name);
  return v > 0 ? static_cast<int64_t>(v) : fallback;
}

// From the caches, with 4 bytes per pair: a tile's B block (kc x 64 lanes)
// as large as L1 (measured on the 1536^3 product with a 32 KiB L1: 96, 128,
// 160 and 192 pairs within 10%, 128 and 160 best; the float32 kernel's 3/4
// of L1 was slower), an A block half of L2, a B panel at most 2 MiB.
const Blocking& blocking() {
  static const Blocking b = [] {
    const int64_t l1 = cache_bytes(_SC_LEVEL1_DCACHE_SIZE, int64_t{32} << 10);
    const int64_t l2 = cache_bytes(_SC_LEVEL2_CACHE_SIZE, int64_t{512} << 10);
    Blocking r{};
    r.kc = std::clamp<int64_t>(l1 / (kWidth * 4), 32, 256) / 8 * 8;
    r.mc = std::max<int64_t>(kTileRows, l2 / 2 / (r.kc * 4) / kTileRows * kTileRows);
    r.nc = std::max<int64_t>(kWidth, (int64_t{2} << 20) / (r.kc * 4) / kWidth * kWidth);
    r.l2 = l2;
    return r;
  }();
  return b;
}

// Two rows of 16 floats as 16 bf16 pairs: lane j = (hi[j] << 16) | lo[j].
TAPEFORMER_BF16 inline __m512i pairs(__m512 lo, __m512 hi) {
  const __m512i l = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(lo)));
  const __m512i h = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(hi)));
  return _mm512_or_si512(l, _mm512_slli_epi32(h, 16));
}

TAPEFORMER_BF16 inline __mmask16 first_lanes(int64_t n) {
  return static_cast<__mmask16>(n >= kLanes ? 0xffff : (1u << n) - 1);
}

// Element (i, k) of an operand, 0 past its K.
inline float at(const MatRef& m, int64_t i, int64_t k) {
  return k < m.cols ? m.data[i * m.row_stride + k * m.col_stride] : 0.0f;
}
inline uint32_t pair_at(const MatRef& m, int64_t i, int64_t k) {
  return static_cast<uint32_t>(to_bf16(at(m, i, k))) | static_cast<uint32_t>(to_bf16(at(m, i, k + 1))) << 16;
}

// The column blocks of n columns, as both the packing and the tiles walk
// them: blocks of 4 registers, then one of the whole registers left, then
// one partial register. fn(j, registers, lanes of the last).
template <class F>
void for_each_column_block(int64_t n, F&& fn) {
  int64_t j = 0;
  for (; j + kWidth <= n; j += kWidth) fn(j, kTilePackets, kLanes);
  if (const int64_t whole = (n - j) / kLanes; whole > 0) {
    fn(j, whole, kLanes);
    j += whole * kLanes;
  }
  if (j < n) fn(j, 1, n - j);
}

// One column block of B (columns j + [0, 16 (packets - 1) + lanes)) at pairs
// [p0, p0 + kc), B^T read as a MatRef (element (j, k) = B(k, j)): kc rows of
// packets * 16 pairs, a partial register padded with zeros.
TAPEFORMER_BF16 void pack_b_block(const MatRef& bt, int64_t p0, int64_t kc, int64_t j, int64_t packets, int64_t lanes,
                                  uint32_t* out) {
  const int64_t width = packets * kLanes, cols = width - kLanes + lanes;
  for (int64_t p = 0; p < kc; ++p, out += width) {
    const int64_t k = 2 * (p0 + p);
    if (bt.row_stride == 1) {  // B's rows contiguous: 16 columns per load
      for (int64_t v = 0; v < width; v += kLanes) {
        const __mmask16 m = first_lanes(cols - v);
        const float* row = bt.data + (j + v) + k * bt.col_stride;
        const __m512 lo = _mm512_maskz_loadu_ps(m, row);
        const __m512 hi = k + 1 < bt.cols ? _mm512_maskz_loadu_ps(m, row + bt.col_stride) : _mm512_setzero_ps();
        _mm512_storeu_si512(out + v, pairs(lo, hi));
      }
    } else {
      for (int64_t v = 0; v < width; ++v) out[v] = v < cols ? pair_at(bt, j + v, k) : 0;
    }
  }
}

void pack_b(const MatRef& bt, int64_t p0, int64_t kc, int64_t j0, int64_t n, uint32_t* out) {
  for_each_column_block(n, [&](int64_t j, int64_t packets, int64_t lanes) {
    pack_b_block(bt, p0, kc, j0 + j, packets, lanes, out);
    out += kc * packets * kLanes;
  });
}

// A's rows [i0, i0 + mc) and pairs [p0, p0 + kc) into tiles of 6 rows. A
// tile of r rows holds r kc pairs either step-major (kc steps of r pairs,
// when A = X^T has a tile's rows contiguous at each k) or row-major (r rows
// of kc pairs, when A's rows are contiguous: 16 pairs per conversion);
// returns whether the tiles are row-major.
TAPEFORMER_BF16 bool pack_a(const MatRef& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, uint32_t* out) {
  const bool rows = a.row_stride != 1 && a.col_stride == 1;
  for (int64_t i = 0; i < mc; i += kTileRows) {
    const int64_t r = std::min<int64_t>(kTileRows, mc - i);
    if (rows) {
      for (int64_t x = 0; x < r; ++x) {
        const float* row = a.data + (i0 + i + x) * a.row_stride;
        // The row two ahead is fetched while this one converts: rows far
        // apart in memory defeat the hardware's prefetcher (the pack ran at
        // memory latency, 12% of the 10.7M model's forward products).
        const float* ahead = row + 2 * a.row_stride;
        for (int64_t p = 0; p < kc; p += kLanes) {
          const int64_t k = 2 * (p0 + p), left = a.cols - k;  // values of k still in the row
          if (i + x + 2 < mc) {
            _mm_prefetch(reinterpret_cast<const char*>(ahead + k), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(ahead + k + kLanes), _MM_HINT_T0);
          }
          const __m512 lo = _mm512_maskz_loadu_ps(first_lanes(left), row + k);
          const __m512 hi = _mm512_maskz_loadu_ps(first_lanes(std::max<int64_t>(0, left - kLanes)), row + k + kLanes);
          _mm512_mask_storeu_epi32(out + x * kc + p, first_lanes(kc - p),
                                   reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
        }
      }
      out += r * kc;
    } else if (a.row_stride == 1) {
      const __mmask16 m = first_lanes(r);
      for (int64_t p = 0; p < kc; ++p, out += r) {
        const int64_t k = 2 * (p0 + p);
        const float* col = a.data + (i0 + i) + k * a.col_stride;
        const __m512 lo = _mm512_maskz_loadu_ps(m, col);
        const __m512 hi = k + 1 < a.cols ? _mm512_maskz_loadu_ps(m, col + a.col_stride) : _mm512_setzero_ps();
        _mm512_mask_storeu_epi32(out, m, pairs(lo, hi));
      }
    } else {
      for (int64_t p = 0; p < kc; ++p, out += r)
        for (int64_t x = 0; x < r; ++x) out[x] = pair_at(a, i0 + i + x, 2 * (p0 + p));
    }
  }
  return rows;
}

// One tile: R rows x V registers of C (the last `lanes` wide when Partial)
// from kc pairs of packed A (R x kc pairs; row-major or step-major tiles,
// pack_a) and B (kc x V*16). Starts from bias (or
// 0) plus C when add_c, as the float32 kernel does.
template <int R, int V, bool Partial, bool RowsA>
TAPEFORMER_BF16 void tile(const uint32_t* a, const uint32_t* b, int64_t kc, float* c, int64_t ldc, const float* bias,
                          bool add_c, int64_t lanes) {
  __m512 acc[R][V];
  const __mmask16 last = Partial ? first_lanes(lanes) : 0xffff;
  for (int v = 0; v < V; ++v) {
    const __mmask16 m = v == V - 1 ? last : 0xffff;
    const __m512 init = bias ? _mm512_maskz_loadu_ps(m, bias + v * kLanes) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r)
      acc[r][v] = add_c ? _mm512_add_ps(init, _mm512_maskz_loadu_ps(m, c + r * ldc + v * kLanes)) : init;
  }
  // A's pair of row r at step p: a[r kc + p] (row-major tiles) or a[p R + r].
  for (int64_t p = 0; p < kc; ++p, a += RowsA ? 1 : R, b += V * kLanes) {
    __m512i bk[V];
    for (int v = 0; v < V; ++v) bk[v] = _mm512_loadu_si512(b + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const __m512i ar = _mm512_set1_epi32(static_cast<int>(a[RowsA ? r * kc : r]));
      for (int v = 0; v < V; ++v)
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], reinterpret_cast<__m512bh>(ar), reinterpret_cast<__m512bh>(bk[v]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm512_mask_storeu_ps(c + r * ldc + v * kLanes, v == V - 1 ? last : 0xffff, acc[r][v]);
}

// A column block of V registers over an A block's tiles.
template <int V, bool Partial, bool RowsA>
TAPEFORMER_BF16 void column_block(const uint32_t* a, const uint32_t* b, int64_t mc, int64_t kc, float* c, int64_t ldc,
                                  const float* bias, bool add_c, int64_t lanes) {
  for (int64_t i = 0; i < mc; i += kTileRows, a += kTileRows * kc, c += kTileRows * ldc) {
    switch (std::min<int64_t>(kTileRows, mc - i)) {
      case 6: tile<6, V, Partial, RowsA>(a, b, kc, c, ldc, bias, add_c, lanes); break;
      case 5: tile<5, V, Partial, RowsA>(a, b, kc, c, ldc, bias, add_c, lanes); break;
      case 4: tile<4, V, Partial, RowsA>(a, b, kc, c, ldc, bias, add_c, lanes); break;
      case 3: tile<3, V, Partial, RowsA>(a, b, kc, c, ldc, bias, add_c, lanes); break;
      case 2: tile<2, V, Partial, RowsA>(a, b, kc, c, ldc, bias, add_c, lanes); break;
      default: tile<1, V, Partial, RowsA>(a, b, kc, c, ldc, bias, add_c, lanes); break;
    }
  }
}
static_assert(kTileRows == 6 && kTilePackets == 4, "the switches cover tiles of 1 to 6 rows and 1 to 4 registers");

// The product of a packed A block (mc rows) and B panel (nc columns) over kc pairs.
template <bool RowsA>
void block(const uint32_t* a, const uint32_t* b, int64_t mc, int64_t nc, int64_t kc, float* c, int64_t ldc,
           const float* bias, bool add_c) {
  for_each_column_block(nc, [&](int64_t j, int64_t packets, int64_t lanes) {
    const float* bj = bias ? bias + j : nullptr;
    if (lanes < kLanes) {
      column_block<1, true, RowsA>(a, b, mc, kc, c + j, ldc, bj, add_c, lanes);
    } else if (packets == 4) {
      column_block<4, false, RowsA>(a, b, mc, kc, c + j, ldc, bj, add_c, lanes);
    } else if (packets == 3) {
      column_block<3, false, RowsA>(a, b, mc, kc, c + j, ldc, bj, add_c, lanes);
    } else if (packets == 2) {
      column_block<2, false, RowsA>(a, b, mc, kc, c + j, ldc, bj, add_c, lanes);
    } else {
      column_block<1, false, RowsA>(a, b, mc, kc, c + j, ldc, bj, add_c, lanes);
    }
    b += kc * packets * kLanes;
  });
}

// The packed size of a B panel of kc pairs and n columns (whole registers).
size_t panel_size(int64_t kc, int64_t n) { return static_cast<size_t>(kc * ((n + kLanes - 1) / kLanes * kLanes)); }

// The product of A's rows [i0, i0 + mc) at pairs [p0, p0 + kc) with a packed
// B panel (columns [j0, j0 + nc)), into C: bias and the caller's accumulate
// start the sum at the first pairs, later ones add to what C holds (float32,
// exactly what the registers held), so the blocking never changes a bit.
void product_block(const MatRef& a, const uint32_t* panel, int64_t i0, int64_t mc, int64_t p0, int64_t kc, int64_t j0,
                   int64_t nc, Scalar* c, int64_t ldc, bool accumulate, const Scalar* bias,
                   std::vector<uint32_t>& packed_a) {
  if (packed_a.size() < static_cast<size_t>(mc * kc)) packed_a.resize(static_cast<size_t>(mc * kc));
  const bool rows = pack_a(a, i0, mc, p0, kc, packed_a.data());
  const bool first = p0 == 0;
  const float* bias0 = first && bias ? bias + j0 : nullptr;
  float* cb = c + i0 * ldc + j0;
  if (rows) {
    block<true>(packed_a.data(), panel, mc, nc, kc, cb, ldc, bias0, !first || accumulate);
  } else {
    block<false>(packed_a.data(), panel, mc, nc, kc, cb, ldc, bias0, !first || accumulate);
  }
}

// C (+)= A B (+ bias) in blocks of K, N and M. Two loop orders, the same sums:
// - B whole, packed once, when it is small (at most kWholeB bytes, what one
//   panel of the other order may take, so the buffers never grow) and A has
//   many rows: then each block of rows runs through every K block while its
//   rows of C stay in L2. Otherwise C, written out and read back per K block,
//   streams from memory: 8192 x 1152 floats of C cost the 10.7M model's
//   forward products 20% (161 against 200 GFLOP/s).
// - GotoBLAS's otherwise: K blocks outermost, a panel of B packed for each
//   and reused by every block of rows (the dW products: a few hundred rows,
//   K in the thousands).
constexpr size_t kWholeB = size_t{2} << 20;

void run(const MatRef& a, const MatRef& b, Scalar* c, int64_t ldc, bool accumulate, const Scalar* bias) {
  const Blocking& bl = blocking();
  const int64_t M = a.rows, N = b.cols, pairs_k = (a.cols + 1) / 2;
  const MatRef bt{b.data, b.cols, b.rows, b.col_stride, b.row_stride};  // B^T: column j of B as row j
  thread_local std::vector<uint32_t> packed_a, packed_b;                // grown once per thread, reused
  size_t whole_b = 0;  // B packed whole: every K block's panels
  for (int64_t j0 = 0; j0 < N; j0 += bl.nc) whole_b += panel_size(pairs_k, std::min(bl.nc, N - j0));
  if (M > bl.mc_rows_per_c(N) && whole_b * sizeof(uint32_t) <= kWholeB) {
    if (packed_b.size() < whole_b) packed_b.resize(whole_b);
    std::vector<size_t> at;  // where each (K block, N panel) starts in packed_b
    size_t used = 0;
    for (int64_t p0 = 0; p0 < pairs_k; p0 += bl.kc)
      for (int64_t j0 = 0; j0 < N; j0 += bl.nc) {
        const int64_t kc = std::min(bl.kc, pairs_k - p0), nc = std::min(bl.nc, N - j0);
        at.push_back(used);
        pack_b(bt, p0, kc, j0, nc, packed_b.data() + used);
        used += panel_size(kc, nc);
      }
    const int64_t mc = bl.mc_rows_per_c(N);
    for (int64_t i0 = 0; i0 < M; i0 += mc) {
      size_t panel = 0;
      for (int64_t p0 = 0; p0 < pairs_k; p0 += bl.kc)
        for (int64_t j0 = 0; j0 < N; j0 += bl.nc, ++panel)
          product_block(a, packed_b.data() + at[panel], i0, std::min(mc, M - i0), p0, std::min(bl.kc, pairs_k - p0),
                        j0, std::min(bl.nc, N - j0), c, ldc, accumulate, bias, packed_a);
    }
    return;
  }
  for (int64_t p0 = 0; p0 < pairs_k; p0 += bl.kc) {
    const int64_t kc = std::min(bl.kc, pairs_k - p0);
    for (int64_t j0 = 0; j0 < N; j0 += bl.nc) {
      const int64_t nc = std::min(bl.nc, N - j0);
      if (packed_b.size() < panel_size(kc, nc)) packed_b.resize(panel_size(kc, nc));
      pack_b(bt, p0, kc, j0, nc, packed_b.data());
      for (int64_t i0 = 0; i0 < M; i0 += bl.mc)
        product_block(a, packed_b.data(), i0, std::min(bl.mc, M - i0), p0, kc, j0, nc, c, ldc, accumulate, bias,
                      packed_a);
    }
  }
}

}  // namespace

void gemm_bf16(const MatRef& a, const MatRef& b, Scalar* c, int64_t ldc, bool accumulate, const Scalar* bias) {
  if (a.rows == 0 || b.cols == 0) return;
  const FlushDenormals flushed;  // as the instruction: the initial sum's denormals too
  run(a, b, c, ldc, accumulate, bias);
}

#else  // no x86-64: bf16_unsupported() refuses bf16 before any product

FlushDenormals::FlushDenormals() : saved_(0) {}
FlushDenormals::~FlushDenormals() {}

void gemm_bf16(const MatRef&, const MatRef&, Scalar*, int64_t, bool, const Scalar*) { fail(bf16_unsupported()); }

#endif

}  // namespace tapeformer::kernels
