#include "tapeformer/core/kernels/matmul.h"

#include <unistd.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/activation_packet.h"
#include "tapeformer/core/kernels/matmul_bf16.h"
#include "tapeformer/core/kernels/precision.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/profile.h"

namespace tapeformer::kernels {
namespace {

// ---------------------------------------------------------------------------
// The packet kernel: C (+)= A B (+ bias) for a B whose rows are contiguous.
//
// Why not Eigen's GEMM: at this project's sizes (K = 128..768, a few hundred
// rows) Eigen spends ~25% of a product packing both operands into panels and
// zero-filling C. This kernel packs nothing: it keeps a 6 x 64 block of C in
// registers, loads 64 contiguous floats of one row of B and broadcasts 6
// scalars of A per step of k. A may have any strides (A = X^T is free), and
// the sum over k runs in order, so results do not depend on how callers
// split rows. On the recipe's linear-layer shapes, one core of the 2-core
// benchmark machine (AVX-512): 103-115 GFLOP/s against Eigen's 71-87 and
// PyTorch/OpenBLAS's 84-100 (bench/gemm_vs_pytorch.sh, 2026-11-23).
// It is written with Eigen's packet primitives, so it vectorises for
// whatever instruction set Eigen targets.

using Packet = eigen::NativePacket;  // products are summed in order of k: the width changes no bit
constexpr int kLanes = eigen::kNativePacketSize;
// Register budget: a tile's accumulators plus one row of B and a broadcast
// must fit the vector registers (32 with AVX-512, 16 with AVX/SSE).
constexpr int kRegisters = EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS;
constexpr int kAccumulators = kRegisters >= 32 ? 24 : 12;  // packets of C held in registers by one tile
constexpr int kTilePackets = kRegisters >= 32 ? 4 : 2;     // packets per tile row in the main column blocks
constexpr int kTileRows = 6;  // the narrowest tile's rows, also for leftover rows
// Steps of k to fetch a strided A ahead: +6% on the recipe's dW products
// with operands out of L2 (8 and 32 steps measured slower).
constexpr int64_t kPrefetchA = 16;
static_assert(kTileRows * kTilePackets <= kAccumulators, "a 6-row tile of the widest block must fit");

struct Operands {
  const Scalar* a;
  int64_t a_rs, a_cs;  // A(i, k) = a[i * a_rs + k * a_cs]
  const Scalar* b;
  int64_t ldb;         // B(k, j) = b[k * ldb + j]
  Scalar* c;
  int64_t ldc;         // C(i, j) = c[i * ldc + j]
  int64_t K;
  const Scalar* bias;  // added to every row of C, or null
  bool accumulate;     // C += ... instead of C = ...
  Epilogue epilogue;   // its aux pointer moves with c

  // The operands of the block of C at row i, column j.
  Operands at(int64_t i, int64_t j) const {
    Operands s = *this;
    s.a += i * a_rs;
    s.b += j;
    s.c += i * ldc + j;
    if (s.bias) s.bias += j;
    if (s.epilogue.aux) s.epilogue.aux += i * ldc + j;
    return s;
  }
};

// What a kernel instance is compiled for: A's layout and the epilogue (a
// runtime test per tile cost the plain product 3% with K = 128).
template <bool StridedA_, Epilogue::Op Op_, bool Packed_ = false>
struct Variant {
  static constexpr bool StridedA = StridedA_;
  static constexpr Epilogue::Op Op = Op_;
  // Packed operands (below): A's tile is K x R floats, row fastest, and B's
  // block K x V packets, so every step of k advances both by constants.
  static constexpr bool Packed = Packed_;
};

// One tile: rows [0, R) and packets [0, V) of the operands' origin, for the
// Variant Cfg. With Partial, only the first `lanes` lanes of the last packet
// are read and written (e.g. the LM head's 65th column).
template <int R, int V, class Cfg, bool Partial = false>
void tile(const Operands& o, int64_t lanes = kLanes) {
  using namespace Eigen::internal;
  auto load = [&](const Scalar* p, int v) {
    if (Partial && v == V - 1) return eigen::load_first(p, lanes);
    return ploadu<Packet>(p);
  };
  Packet acc[R][V];
  for (int v = 0; v < V; ++v) {
    const Packet init = o.bias ? load(o.bias + v * kLanes, v) : pset1<Packet>(0.0f);
    for (int r = 0; r < R; ++r)
      acc[r][v] = o.accumulate ? padd(init, load(o.c + r * o.ldc + v * kLanes, v)) : init;
  }
  if constexpr (Cfg::Packed) {
    // Pointer steps of compile-time size: the loop is loads, broadcasts and
    // multiply-adds only (runtime strides cost the packed product ~10%).
    const Scalar* a = o.a;
    const Scalar* b = o.b;
    for (int64_t k = 0; k < o.K; ++k, a += R, b += V * kLanes) {
      Packet bk[V];
      for (int v = 0; v < V; ++v) bk[v] = ploadu<Packet>(b + v * kLanes);
      for (int r = 0; r < R; ++r) {
        const Packet ar = pset1<Packet>(a[r]);
        for (int v = 0; v < V; ++v) acc[r][v] = pmadd(ar, bk[v], acc[r][v]);
      }
    }
  }
  for (int64_t k = 0; k < (Cfg::Packed ? 0 : o.K); ++k) {
    if constexpr (Cfg::StridedA) {
      // A's rows are not contiguous in k (A = X^T for dW): every step of k
      // reads a new cache line, so fetch it ahead (prefetching never faults).
      for (int r = 0; r < R; ++r) prefetch(o.a + r * o.a_rs + (k + kPrefetchA) * o.a_cs);
    }
    Packet bk[V];
    for (int v = 0; v < V; ++v) bk[v] = load(o.b + k * o.ldb + v * kLanes, v);
    for (int r = 0; r < R; ++r) {
      const Packet ar = pset1<Packet>(o.a[r * o.a_rs + k * o.a_cs]);
      for (int v = 0; v < V; ++v) acc[r][v] = pmadd(ar, bk[v], acc[r][v]);
    }
  }
  auto store = [&](Scalar* p, const Packet& x, int v) {
    if (Partial && v == V - 1) {
      eigen::store_first(p, x, lanes);
    } else {
      pstoreu(p, x);
    }
  };
  const Epilogue& e = o.epilogue;
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) {
      const int64_t at = r * o.ldc + v * kLanes;
      Packet z = acc[r][v];
      if constexpr (Cfg::Op == Epilogue::Op::Multiply) {
        z = pmul(z, load(e.aux + at, v));
      } else if constexpr (Cfg::Op == Epilogue::Op::Activate) {
        Packet dydx;
        activate(e.act, z, z, dydx);
        if (e.aux) store(e.aux + at, dydx, v);
      } else if constexpr (Cfg::Op == Epilogue::Op::ActivateKeepInput) {
        store(e.aux + at, z, v);
        Packet dydx;
        activate(e.act, z, z, dydx);
      }
      store(o.c + at, z, v);
    }
  }
}

// All rows of C for V packets of columns: tiles of kAccumulators / V rows
// (narrow column blocks take more rows, so every step of k still has 24
// independent multiply-adds for one broadcast per row), then 6-row tiles,
// then the leftover rows.
template <int V, class Cfg, bool Partial = false>
void column_block(Operands o, int64_t M, int64_t lanes = kLanes) {
  constexpr int R = kAccumulators / V;
  int64_t i = 0;
  auto run = [&](auto rows) {
    constexpr int n = decltype(rows)::value;
    tile<n, V, Cfg, Partial>(o, lanes);
    o = o.at(n, 0);
    i += n;
  };
  while (i + R <= M) run(std::integral_constant<int, R>());
  while (i + kTileRows <= M) run(std::integral_constant<int, kTileRows>());
  static_assert(kTileRows == 6, "the switch below covers kTileRows - 1 leftover rows");
  switch (M - i) {
    case 5: tile<5, V, Cfg, Partial>(o, lanes); break;
    case 4: tile<4, V, Cfg, Partial>(o, lanes); break;
    case 3: tile<3, V, Cfg, Partial>(o, lanes); break;
    case 2: tile<2, V, Cfg, Partial>(o, lanes); break;
    case 1: tile<1, V, Cfg, Partial>(o, lanes); break;
    default: break;
  }
}

// The column blocks of `n` columns, as both paths walk them:
// full tiles of kTilePackets packets, then one narrower block of whole
// packets, then one partial packet. fn(j, packets, lanes of the last).
template <class F>
void for_each_column_block(int64_t n, F&& fn) {
  int64_t j = 0;
  for (; j + kTilePackets * kLanes <= n; j += kTilePackets * kLanes) fn(j, kTilePackets, kLanes);
  if (const int64_t whole = (n - j) / kLanes; whole > 0) {
    fn(j, whole, kLanes);
    j += whole * kLanes;
  }
  if (j < n) fn(j, 1, n - j);
}

// fn(V, Partial) as std::integral_constant values, for a column block of
// `packets` packets whose last has `lanes` lanes: the tile widths a build
// instantiates.
template <class F>
void with_block_width(int64_t packets, int64_t lanes, F&& fn) {
  using std::integral_constant;
  if (lanes < kLanes) return fn(integral_constant<int, 1>(), std::true_type());
  if (packets == kTilePackets) return fn(integral_constant<int, kTilePackets>(), std::false_type());
  if (packets == 3) return fn(integral_constant<int, 3>(), std::false_type());  // 3 < kTilePackets only with AVX-512
  if (packets == 2) return fn(integral_constant<int, 2>(), std::false_type());
  fn(integral_constant<int, 1>(), std::false_type());
}

// C[M, N] (+)= A[M, K] B[K, N] (+ bias) with B's rows contiguous, read in
// place: for products whose operands fit the caches.
template <class Cfg>
void packet_gemm(Operands o, int64_t M, int64_t N) {
  for_each_column_block(N, [&](int64_t j, int64_t packets, int64_t lanes) {
    with_block_width(packets, lanes, [&](auto v, auto partial) {
      column_block<decltype(v)::value, Cfg, decltype(partial)::value>(o.at(0, j), M, lanes);
    });
  });
}

// ---------------------------------------------------------------------------
// Cache blocking for large products (GotoBLAS's loops).
//
// Read in place, a product of thousands of rows streams all of A from memory
// once per column block of B, and B's column block (K x 64 floats at a stride
// of N) thrashes L1, whose sets a power-of-two row stride maps onto a few:
// on the 10.7M-parameter model's shapes (8192 rows, K and N 384..1536) the
// in-place kernel ran at 15-27 GFLOP/s on one core against 65-87 on the small
// recipe's. Here K is cut into blocks of kc, and for each:
// - a panel of B (kc x nc) is copied into column blocks of kc x W contiguous
//   floats (W = one tile's width), which stay in L1 while every row tile of
//   an A block passes over them;
// - A is copied mc rows at a time (an L2-sized block), each 6-row tile as
//   kc x 6 interleaved floats, so a step of k reads one line.
// Partial sums go to C between K blocks as float32, which is exactly what
// the register held: every element is still summed over k in order, so the
// bits equal the in-place kernel's, whatever the block sizes. That is why
// the block sizes may follow the machine's caches (blocking()).

struct Blocking {
  int64_t kc, mc, nc;
};

// Block sizes from the caches of the machine we run on (sysconf; 32 KiB L1
// and 512 KiB L2 where it does not say): a tile's B block (kc x W) and A
// slice (6 x kc) fill at most 3/4 of L1; an A block (mc x kc) half of L2; a
// B panel (kc x nc) at most 2 MiB.
int64_t cache_bytes(int name, int64_t fallback) {
  const long v = sysconf(name);
  return v > 0 ? static_cast<int64_t>(v) : fallback;
}
int64_t l2_bytes() { return cache_bytes(_SC_LEVEL2_CACHE_SIZE, int64_t{512} << 10); }

const Blocking& blocking() {
  static const Blocking b = [] {
    const int64_t l1 = cache_bytes(_SC_LEVEL1_DCACHE_SIZE, int64_t{32} << 10), l2 = l2_bytes();
    constexpr int64_t W = kTilePackets * kLanes, bytes = sizeof(Scalar);
    Blocking r{};
    r.kc = std::clamp<int64_t>(l1 * 3 / 4 / ((W + kTileRows) * bytes), 32, 512) / 8 * 8;
    r.mc = std::max<int64_t>(kTileRows, l2 / 2 / (r.kc * bytes) / kTileRows * kTileRows);
    r.nc = std::max<int64_t>(W, (int64_t{2} << 20) / (r.kc * bytes) / W * W);
    return r;
  }();
  return b;
}

// Below this many rows, copying B costs more than it saves (each B block
// would be read by one or two row tiles).
constexpr int64_t kPackMinRows = 4 * kTileRows;

// Whether a product runs blocked and packed. In place is as fast while A
// stays in L2 across column blocks and is read by rows (the small recipe's
// forward and dX products: 384 rows, K <= 512); a transposed A (X^T of the
// dW products) reads a new line per step of k, which packing turns into one,
// and an A larger than L2 would be streamed from memory per column block.
bool packs(int64_t M, int64_t K, bool strided_a) {
  static const int64_t l2 = l2_bytes();
  return M >= kPackMinRows && (strided_a || M * K * static_cast<int64_t>(sizeof(Scalar)) > 2 * l2);
}

// B[k0 .. k0 + kc, j0 .. j0 + n) into `out`: each column block as kc rows of
// its packets' width, contiguous; a partial packet is padded with zeros.
void pack_b(const Scalar* b, int64_t ldb, int64_t kc, int64_t n, Scalar* out) {
  for_each_column_block(n, [&](int64_t j, int64_t packets, int64_t lanes) {
    const int64_t width = packets * kLanes, copy = (packets - 1) * kLanes + lanes;
    for (int64_t k = 0; k < kc; ++k, out += width) {
      const Scalar* row = b + k * ldb + j;
      std::copy(row, row + copy, out);
      std::fill(out + copy, out + width, 0.0f);
    }
  });
}

// Rows [0, mc) and columns [0, kc) of A (A(i, k) = a[i * rs + k * cs]) into
// `out`, tile by tile: a tile of r <= 6 rows as kc x r floats, row fastest.
void pack_a(const Scalar* a, int64_t rs, int64_t cs, int64_t mc, int64_t kc, Scalar* out) {
  for (int64_t i = 0; i < mc; i += kTileRows) {
    const int64_t r = std::min<int64_t>(kTileRows, mc - i);
    const Scalar* tile = a + i * rs;
    if (rs == 1) {  // A = X^T: a tile's rows are contiguous at each k
      for (int64_t k = 0; k < kc; ++k, out += r) std::copy(tile + k * cs, tile + k * cs + r, out);
    } else {
      for (int64_t k = 0; k < kc; ++k, out += r)
        for (int64_t x = 0; x < r; ++x) out[x] = tile[x * rs + k * cs];
    }
  }
}

// One packed column block (V packets) over the packed rows of an A block:
// `o` is the block's origin in C with a and b pointing at the packed data.
template <int V, class Cfg, bool Partial>
void packed_column_block(Operands o, int64_t mc, int64_t lanes) {
  const Scalar* a = o.a;
  for (int64_t i = 0; i < mc; i += kTileRows) {
    const int64_t r = std::min<int64_t>(kTileRows, mc - i);
    Operands t = o.at(i, 0);
    // The next tile's rows of C, on their way while this tile computes
    // (after the first K block a tile starts by loading its C).
    for (int64_t x = 0; x < kTileRows && i + kTileRows + x < mc; ++x)
      for (int v = 0; v < V; ++v) Eigen::internal::prefetch(t.c + (kTileRows + x) * o.ldc + v * kLanes);
    t.a = a + i * o.K;  // tiles before this one hold i rows of K values
    t.a_rs = 1;
    t.a_cs = r;
    switch (r) {
      case 6: tile<6, V, Cfg, Partial>(t, lanes); break;
      case 5: tile<5, V, Cfg, Partial>(t, lanes); break;
      case 4: tile<4, V, Cfg, Partial>(t, lanes); break;
      case 3: tile<3, V, Cfg, Partial>(t, lanes); break;
      case 2: tile<2, V, Cfg, Partial>(t, lanes); break;
      default: tile<1, V, Cfg, Partial>(t, lanes); break;
    }
  }
}
static_assert(kTileRows == 6, "packed_column_block's switch covers tiles of 1 to 6 rows");

// The product over one K block: packed A block (mc rows) x packed B panel.
template <class Cfg>
void packed_block(Operands o, int64_t mc, int64_t nc, const Scalar* packed_b) {
  for_each_column_block(nc, [&](int64_t j, int64_t packets, int64_t lanes) {
    Operands c = o.at(0, j);
    c.a = o.a;  // packed: the same A block for every column block
    c.b = packed_b;
    c.ldb = packets * kLanes;
    packed_b += o.K * c.ldb;
    with_block_width(packets, lanes, [&](auto v, auto partial) {
      packed_column_block<decltype(v)::value, Cfg, decltype(partial)::value>(c, mc, lanes);
    });
  });
}

// The packed tiles: constant pointer steps, no prefetching.
template <Epilogue::Op Op>
using Packed = Variant<false, Op, true>;

// C (+)= A B (+ bias), then the epilogue: in place for small products (and
// K = 0, where C is the bias or kept), blocked and packed for large ones.
template <bool StridedA, Epilogue::Op Op>
void product_packet(const Operands& o, int64_t M, int64_t N) {
  if (o.K == 0 || !packs(M, o.K, StridedA)) return packet_gemm<Variant<StridedA, Op>>(o, M, N);
  const Blocking& bl = blocking();
  thread_local std::vector<Scalar> packed_a, packed_b;  // grown once per thread, reused
  const int64_t W = kTilePackets * kLanes;
  for (int64_t k0 = 0; k0 < o.K; k0 += bl.kc) {
    const int64_t kc = std::min(bl.kc, o.K - k0);
    const bool first = k0 == 0, last = k0 + kc == o.K;
    for (int64_t j0 = 0; j0 < N; j0 += bl.nc) {
      const int64_t nc = std::min(bl.nc, N - j0);
      const size_t b_size = static_cast<size_t>(kc * ((nc + W - 1) / W * W + W));
      if (packed_b.size() < b_size) packed_b.resize(b_size);
      pack_b(o.b + k0 * o.ldb + j0, o.ldb, kc, nc, packed_b.data());
      for (int64_t i0 = 0; i0 < M; i0 += bl.mc) {
        const int64_t mc = std::min(bl.mc, M - i0);
        if (packed_a.size() < static_cast<size_t>(mc * kc)) packed_a.resize(static_cast<size_t>(mc * kc));
        pack_a(o.a + i0 * o.a_rs + k0 * o.a_cs, o.a_rs, o.a_cs, mc, kc, packed_a.data());
        Operands blk = o.at(i0, j0);
        blk.a = packed_a.data();
        blk.K = kc;
        // Bias and the caller's accumulate start the sum; later K blocks add
        // to what C holds; the epilogue sees the finished sum.
        if (!first) blk.bias = nullptr, blk.accumulate = true;
        if (last) {
          packed_block<Packed<Op>>(blk, mc, nc, packed_b.data());
        } else {
          packed_block<Packed<Epilogue::Op::Store>>(blk, mc, nc, packed_b.data());
        }
      }
    }
  }
}

// The bf16 product on any CPU (precision.h): rounded copies of A and B, each
// pair (k = 2p, 2p + 1) swapped so that the float32 kernel's sum in order of k
// takes the odd product first, with denormals flushed, as the instruction
// does. Every product of two bf16 values is exact in float32, and an FMA
// rounds the sum once: the bits equal gemm_bf16's.
void gemm_bf16_portable(const MatRef& a, const MatRef& b, Scalar* c, int64_t ldc, bool accumulate, const Scalar* bias) {
  const int64_t M = a.rows, N = b.cols, K = a.cols, Kp = (K + 1) / 2 * 2;
  thread_local std::vector<Scalar> ra, rb;
  ra.assign(static_cast<size_t>(M * Kp), 0.0f);
  rb.assign(static_cast<size_t>(Kp * N), 0.0f);
  for (int64_t k = 0; k < K; ++k) {
    const int64_t to = k ^ 1;  // its place in the swapped pair
    for (int64_t i = 0; i < M; ++i) ra[i * Kp + to] = round_bf16(a.data[i * a.row_stride + k * a.col_stride]);
    for (int64_t j = 0; j < N; ++j) rb[to * N + j] = round_bf16(b.data[k * b.row_stride + j * b.col_stride]);
  }
  const FlushDenormals flushed;
  const Operands o{ra.data(), Kp, 1, rb.data(), N, c, ldc, Kp, bias, accumulate, {}};
  product_packet<false, Epilogue::Op::Store>(o, M, N);
}

MatRef matrix_of(const Tensor& t, const Scalar* base) {
  const int r = t.rank();
  return MatRef{base, t.dim(r - 2), t.dim(r - 1), t.strides()[r - 2], t.strides()[r - 1]};
}

// The epilogue on rows x cols of finished sums at c (row stride ldc), for the
// products whose kernels store plain sums.
void apply_epilogue(const Epilogue& epilogue, Scalar* c, int64_t ldc, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows && epilogue.op != Epilogue::Op::Store; ++i) {
    Scalar* row = c + i * ldc;
    Scalar* aux = epilogue.aux ? epilogue.aux + i * ldc : nullptr;
    if (epilogue.op == Epilogue::Op::Multiply) {
      eigen::array(row, cols) *= eigen::array(aux, cols);
    } else if (epilogue.op == Epilogue::Op::ActivateKeepInput) {
      std::copy_n(row, cols, aux);
      activate_rows(epilogue.act, row, nullptr, cols);
    } else {
      activate_rows(epilogue.act, row, aux, cols);
    }
  }
}

}  // namespace

bool is_matrix_layout(const Tensor& t) {
  const int r = t.rank();
  if (r < 2) return false;
  const int64_t rs = t.strides()[r - 2], cs = t.strides()[r - 1];
  const int64_t rows = t.dim(r - 2), cols = t.dim(r - 1);
  // Row-major rows (cs == 1) or column-major (rs == 1); size-1 dims may carry any stride.
  if ((cs == 1 || cols == 1) && rs >= std::max<int64_t>(cols, 1)) return true;
  if ((rs == 1 || rows == 1) && cs >= std::max<int64_t>(rows, 1)) return true;
  return false;
}

namespace {
void check_epilogue(bool accumulate, const Epilogue& epilogue) {
  TAPEFORMER_CHECK(!accumulate || epilogue.op == Epilogue::Op::Store, "gemm: an epilogue needs accumulate == false");
  TAPEFORMER_CHECK(epilogue.op != Epilogue::Op::Multiply || epilogue.aux, "gemm: a multiply epilogue needs its factor");
  TAPEFORMER_CHECK(epilogue.op != Epilogue::Op::ActivateKeepInput || epilogue.aux,
                   "gemm: an epilogue that keeps its input needs a buffer for it");
}
}  // namespace

void gemm(const MatRef& a, const MatRef& b, Scalar* c, int64_t ldc, bool accumulate, const Scalar* bias,
          const Epilogue& epilogue) {
  const Precision p = product_precision();
  if (p == Precision::fp32 || a.cols == 0) return gemm_fp32(a, b, c, ldc, accumulate, bias, epilogue);
  check_epilogue(accumulate, epilogue);
  if (a.rows == 0 || b.cols == 0) return;
  // bf16 operands (precision.h); the epilogue on the finished float32 sums.
  if (p == Precision::bf16) {
    gemm_bf16(a, b, c, ldc, accumulate, bias);
  } else {
    gemm_bf16_portable(a, b, c, ldc, accumulate, bias);
  }
  apply_epilogue(epilogue, c, ldc, a.rows, b.cols);
}

void gemm_fp32(const MatRef& a, const MatRef& b, Scalar* c, int64_t ldc, bool accumulate, const Scalar* bias,
               const Epilogue& epilogue) {
  check_epilogue(accumulate, epilogue);
  if (a.rows == 0 || b.cols == 0) return;
  // A size-1 dim may have an arbitrary stride; normalise so the dispatch below
  // sees a consistent layout.
  MatRef aa = a, bb = b;
  if (aa.cols == 1) aa.col_stride = 1, aa.row_stride = std::max<int64_t>(aa.row_stride, 1);
  if (bb.cols == 1) bb.col_stride = 1, bb.row_stride = std::max<int64_t>(bb.row_stride, 1);
  thread_local std::vector<Scalar> b_rows;
  if (bb.col_stride != 1 && bb.rows > 0) {
    // The packet kernel reads B by rows: a B with strided rows is copied
    // (K x N floats against M x K x N multiply-adds), so every product sums
    // over k in order on every machine.
    b_rows.resize(static_cast<size_t>(bb.rows * bb.cols));
    for (int64_t k = 0; k < bb.rows; ++k)
      for (int64_t j = 0; j < bb.cols; ++j) b_rows[k * bb.cols + j] = bb.data[k * bb.row_stride + j * bb.col_stride];
    bb = MatRef{b_rows.data(), bb.rows, bb.cols, bb.cols, 1};
  }
  {
    const Operands o{aa.data, aa.row_stride, aa.col_stride, bb.data, bb.row_stride, c, ldc, aa.cols, bias, accumulate,
                     epilogue};
    const bool strided = aa.col_stride != 1;
    const int64_t M = aa.rows, N = bb.cols;
    switch (epilogue.op) {
      case Epilogue::Op::Store:
        return strided ? product_packet<true, Epilogue::Op::Store>(o, M, N)
                       : product_packet<false, Epilogue::Op::Store>(o, M, N);
      case Epilogue::Op::Activate:
        return strided ? product_packet<true, Epilogue::Op::Activate>(o, M, N)
                       : product_packet<false, Epilogue::Op::Activate>(o, M, N);
      case Epilogue::Op::ActivateKeepInput:
        return strided ? product_packet<true, Epilogue::Op::ActivateKeepInput>(o, M, N)
                       : product_packet<false, Epilogue::Op::ActivateKeepInput>(o, M, N);
      case Epilogue::Op::Multiply:
        return strided ? product_packet<true, Epilogue::Op::Multiply>(o, M, N)
                       : product_packet<false, Epilogue::Op::Multiply>(o, M, N);
    }
  }
}

void batched_matmul(const Tensor& a_in, const Tensor& b_in, Tensor& out, bool accumulate, const Tensor& bias,
                    const Epilogue& epilogue) {
  const profile::Scope timed("matmul");
  const Tensor a = is_matrix_layout(a_in) ? a_in : a_in.contiguous();
  // The packet kernel reads B by rows: a transposed B is copied once here
  // (K x N floats, against M x K x N multiply-adds) rather than per row block.
  const int rb = b_in.rank();
  const bool b_rows = rb >= 2 && (b_in.strides()[rb - 1] == 1 || b_in.dim(rb - 1) == 1);
  const Tensor b = b_rows && is_matrix_layout(b_in) ? b_in : b_in.contiguous();
  const int r = out.rank();
  TAPEFORMER_CHECK(out.is_contiguous() && a.rank() == r && b.rank() == r,
                   "batched_matmul: internal layout mismatch ", a.shape(), " x ", b.shape(),
                   " -> ", out.shape());
  const int64_t M = out.dim(r - 2), N = out.dim(r - 1), K = a.dim(r - 1);
  const int64_t batch = out.numel() / std::max<int64_t>(1, M * N);
  if (out.numel() == 0) return;
  TAPEFORMER_CHECK(!bias.defined() || (bias.is_contiguous() && bias.numel() == N), "batched_matmul: bias ",
                   bias.defined() ? bias.shape().str() : "", " must be [", N, "] for output ", out.shape());
  const Scalar* bias_data = bias.defined() ? bias.data() : nullptr;

  // Per batch index, the element offsets of a and b (their batch strides may be 0).
  std::vector<int64_t> a_off(batch), b_off(batch);
  for (int64_t bi = 0; bi < batch; ++bi) {
    int64_t rem = bi, ao = 0, bo = 0;
    for (int d = r - 3; d >= 0; --d) {
      const int64_t idx = rem % out.dim(d);
      rem /= out.dim(d);
      ao += idx * a.strides()[d];
      bo += idx * b.strides()[d];
    }
    a_off[bi] = ao;
    b_off[bi] = bo;
  }

  // Split rows so there are enough work items for all threads, but keep blocks
  // big enough for packing to pay off. Inside a parallel region (a shard's
  // ops) the loop runs serially: one block per batch index then packs B once
  // instead of once per block.
  // Too few rows for that (a token at a time when generating, a subset of
  // rows): column blocks of whole tiles too. Every element is summed over k
  // in order whichever block computes it, so the split changes no bit.
  const int threads = parallel::in_parallel_region() ? 1 : parallel::num_threads();
  const int64_t flops = M * N * K;
  constexpr int64_t kColumnBlock = 64;  // columns: a multiple of every tile's width
  int64_t row_blocks = 1, col_blocks = 1;
  if (batch < threads && flops >= (int64_t{1} << 15)) {
    const int64_t wanted = (threads + batch - 1) / batch * 2;
    row_blocks = std::min<int64_t>(wanted, std::max<int64_t>(1, M / 16));
    // Each block worth a task (a 1 x 128 x 384 product is not: 49K multiply-adds).
    col_blocks = std::max<int64_t>(1, std::min({wanted / row_blocks, N / kColumnBlock, flops >> 17}));
  }
  const int64_t rows_per = (M + row_blocks - 1) / row_blocks;
  const int64_t cols_per = ((N + col_blocks - 1) / col_blocks + kColumnBlock - 1) / kColumnBlock * kColumnBlock;
  const int64_t blocks = row_blocks * col_blocks;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, flops));
  Scalar* c = out.data();
  const Scalar* ab = a.data();
  const Scalar* bb = b.data();
  parallel::parallel_for(batch * blocks, grain, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t bi = w / blocks, m0 = (w % blocks) / col_blocks * rows_per, n0 = w % col_blocks * cols_per;
      const int64_t m1 = std::min(M, m0 + rows_per), n1 = std::min(N, n0 + cols_per);
      if (m0 >= m1 || n0 >= n1) continue;
      MatRef am = matrix_of(a, ab + a_off[bi]), bm = matrix_of(b, bb + b_off[bi]);
      am.data += m0 * am.row_stride;
      am.rows = m1 - m0;
      bm.data += n0 * bm.col_stride;
      bm.cols = n1 - n0;
      Epilogue e = epilogue;
      if (e.aux) e.aux += bi * M * N + m0 * N + n0;
      gemm(am, bm, c + bi * M * N + m0 * N + n0, N, accumulate, bias_data ? bias_data + n0 : nullptr, e);
    }
  });
}

}  // namespace tapeformer::kernels
