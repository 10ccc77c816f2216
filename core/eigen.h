// The one bridge between tapeformer buffers and Eigen (STYLE rule 10).
//
//   auto x = eigen::matrix(ptr, rows, cols);          // row-major, contiguous rows
//   auto v = eigen::array(ptr, n);                     // 1-D array for coefficient-wise maps
//   v = v.max(0.0f);                                   // vectorised by Eigen
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tapeformer/core/storage.h"

namespace tapeformer::eigen {

using RowMatrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ColMatrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using Array = Eigen::Array<Scalar, Eigen::Dynamic, 1>;
using Stride = Eigen::OuterStride<>;

using MatrixMap = Eigen::Map<RowMatrix, Eigen::Unaligned, Stride>;
using ConstMatrixMap = Eigen::Map<const RowMatrix, Eigen::Unaligned, Stride>;
using ConstColMatrixMap = Eigen::Map<const ColMatrix, Eigen::Unaligned, Stride>;
using ArrayMap = Eigen::Map<Array>;
using ConstArrayMap = Eigen::Map<const Array>;

// rows x cols row-major matrix at p; ld = distance between rows (default cols).
inline MatrixMap matrix(Scalar* p, int64_t rows, int64_t cols, int64_t ld = -1) {
  return MatrixMap(p, rows, cols, Stride(ld < 0 ? cols : ld));
}
inline ConstMatrixMap matrix(const Scalar* p, int64_t rows, int64_t cols, int64_t ld = -1) {
  return ConstMatrixMap(p, rows, cols, Stride(ld < 0 ? cols : ld));
}
// rows x cols column-major matrix at p (the transpose of a row-major buffer).
inline ConstColMatrixMap col_matrix(const Scalar* p, int64_t rows, int64_t cols, int64_t ld) {
  return ConstColMatrixMap(p, rows, cols, Stride(ld));
}
inline ArrayMap array(Scalar* p, int64_t n) { return ArrayMap(p, n); }
inline ConstArrayMap array(const Scalar* p, int64_t n) { return ConstArrayMap(p, n); }

// Packets: vectors of Scalars for the kernels that vectorise by hand.
//
// NativePacket is one SIMD register for whatever instruction set Eigen
// targets (16 floats with AVX-512, 8 with AVX2): the GEMM's tiles and the
// transposes, whose results do not depend on the width (every element of a
// product is summed over k in order).
//
// Packet is 16 floats on every instruction set: one AVX-512 register, or two
// AVX2 registers side by side. Every kernel that reduces across lanes (a
// row's sum, max, dot product, a norm's statistics) accumulates lane i of
// Packet from the entries i, i + 16, i + 32, ... and folds the 16 lanes in
// one tree (sum() below), so its bits are the same on an AVX2 and an
// AVX-512 machine. The elementwise functions (exp, tanh, log) are one
// polynomial with the same multiply-adds on every width.
using NativePacket = Eigen::internal::packet_traits<Scalar>::type;
inline constexpr int kNativePacketSize = Eigen::internal::packet_traits<Scalar>::size;
inline constexpr int kPacketSize = 16;
static_assert(kNativePacketSize >= 4 && kPacketSize % kNativePacketSize == 0,
              "Packet is built from whole SIMD registers of 4, 8 or 16 floats");

#if defined(EIGEN_VECTORIZE_AVX512)
using Packet = Eigen::internal::Packet16f;
#else
// 16 lanes as 16 / kNativePacketSize registers, lowest lanes first.
struct Packet {
  NativePacket part[kPacketSize / kNativePacketSize];
};
#endif

}  // namespace tapeformer::eigen

#if !defined(EIGEN_VECTORIZE_AVX512)
// Eigen's packet functions for the multi-register Packet, register by
// register, so the kernels write the same code for every width. There is no
// predux: a sum across lanes is eigen::sum (the canonical tree).
namespace Eigen::internal {
namespace tf = tapeformer::eigen;
inline constexpr int kTfParts = tf::kPacketSize / tf::kNativePacketSize;
template <>
struct unpacket_traits<tf::Packet> {
  typedef float type;
  typedef tf::Packet half;
  enum {
    size = tf::kPacketSize,
    alignment = Aligned64,
    vectorizable = true,
    masked_load_available = false,
    masked_store_available = false
  };
};
#define TAPEFORMER_PACKET_MAP(expr)                     \
  tf::Packet r;                                         \
  for (int h = 0; h < kTfParts; ++h) r.part[h] = expr; \
  return r
template <>
inline tf::Packet pset1<tf::Packet>(const float& a) {
  TAPEFORMER_PACKET_MAP(pset1<tf::NativePacket>(a));
}
template <>
inline tf::Packet ploadu<tf::Packet>(const float* p) {
  TAPEFORMER_PACKET_MAP(ploadu<tf::NativePacket>(p + h * tf::kNativePacketSize));
}
template <>
inline tf::Packet pload<tf::Packet>(const float* p) {
  TAPEFORMER_PACKET_MAP(pload<tf::NativePacket>(p + h * tf::kNativePacketSize));
}
inline void pstoreu(float* p, const tf::Packet& x) {
  for (int h = 0; h < kTfParts; ++h) pstoreu(p + h * tf::kNativePacketSize, x.part[h]);
}
inline void pstore(float* p, const tf::Packet& x) {
  for (int h = 0; h < kTfParts; ++h) pstore(p + h * tf::kNativePacketSize, x.part[h]);
}
#define TAPEFORMER_PACKET_UNARY(name) \
  inline tf::Packet name(const tf::Packet& a) { TAPEFORMER_PACKET_MAP(name(a.part[h])); }
#define TAPEFORMER_PACKET_BINARY(name) \
  inline tf::Packet name(const tf::Packet& a, const tf::Packet& b) { TAPEFORMER_PACKET_MAP(name(a.part[h], b.part[h])); }
TAPEFORMER_PACKET_UNARY(pnegate)
TAPEFORMER_PACKET_UNARY(psqrt)
TAPEFORMER_PACKET_UNARY(pabs)
TAPEFORMER_PACKET_UNARY(pfloor)
TAPEFORMER_PACKET_BINARY(padd)
TAPEFORMER_PACKET_BINARY(psub)
TAPEFORMER_PACKET_BINARY(pmul)
TAPEFORMER_PACKET_BINARY(pdiv)
TAPEFORMER_PACKET_BINARY(pmax)
TAPEFORMER_PACKET_BINARY(pmin)
TAPEFORMER_PACKET_BINARY(pand)
TAPEFORMER_PACKET_BINARY(pcmp_lt)
TAPEFORMER_PACKET_BINARY(pcmp_le)
TAPEFORMER_PACKET_BINARY(pcmp_eq)
inline tf::Packet pmadd(const tf::Packet& a, const tf::Packet& b, const tf::Packet& c) {
  TAPEFORMER_PACKET_MAP(pmadd(a.part[h], b.part[h], c.part[h]));
}
inline tf::Packet pselect(const tf::Packet& mask, const tf::Packet& a, const tf::Packet& b) {
  TAPEFORMER_PACKET_MAP(pselect(mask.part[h], a.part[h], b.part[h]));
}
#undef TAPEFORMER_PACKET_UNARY
#undef TAPEFORMER_PACKET_BINARY
#undef TAPEFORMER_PACKET_MAP
}  // namespace Eigen::internal
#endif

namespace tapeformer::eigen {

// The first n lanes (0 <= n <= lanes of P) of p, the other lanes 0, and the
// store of only those lanes: for the partial last packet of a row. Masked
// loads and stores with AVX or AVX-512; a copy through a small buffer
// elsewhere. Nothing outside [p, p + n) is read or written.
template <class P = NativePacket>
P load_first(const Scalar* p, int64_t n);
template <class P = NativePacket>
void store_first(Scalar* p, const P& x, int64_t n);

template <>
inline NativePacket load_first<NativePacket>(const Scalar* p, int64_t n) {
#if defined(EIGEN_VECTORIZE_AVX512) || defined(EIGEN_VECTORIZE_AVX)
  using Mask = std::conditional_t<(kNativePacketSize > 8), uint16_t, uint8_t>;  // Eigen's mask_t: a bit per lane
  return Eigen::internal::ploadu<NativePacket>(p, static_cast<Mask>((1u << n) - 1));
#else
  alignas(64) Scalar buf[kNativePacketSize] = {};
  for (int64_t i = 0; i < n; ++i) buf[i] = p[i];
  return Eigen::internal::pload<NativePacket>(buf);
#endif
}
template <>
inline void store_first<NativePacket>(Scalar* p, const NativePacket& x, int64_t n) {
#if defined(EIGEN_VECTORIZE_AVX512) || defined(EIGEN_VECTORIZE_AVX)
  using Mask = std::conditional_t<(kNativePacketSize > 8), uint16_t, uint8_t>;
  Eigen::internal::pstoreu(p, x, static_cast<Mask>((1u << n) - 1));
#else
  alignas(64) Scalar buf[kNativePacketSize];
  Eigen::internal::pstore(buf, x);
  for (int64_t i = 0; i < n; ++i) p[i] = buf[i];
#endif
}

#if !defined(EIGEN_VECTORIZE_AVX512)
template <>
inline Packet load_first<Packet>(const Scalar* p, int64_t n) {
  Packet r;
  for (int h = 0; h < kPacketSize / kNativePacketSize; ++h) {
    const int64_t lanes = std::clamp<int64_t>(n - h * kNativePacketSize, 0, kNativePacketSize);
    r.part[h] = lanes == kNativePacketSize ? Eigen::internal::ploadu<NativePacket>(p + h * kNativePacketSize)
                : lanes == 0               ? Eigen::internal::pset1<NativePacket>(0.0f)
                                           : load_first<NativePacket>(p + h * kNativePacketSize, lanes);
  }
  return r;
}
template <>
inline void store_first<Packet>(Scalar* p, const Packet& x, int64_t n) {
  for (int h = 0; h < kPacketSize / kNativePacketSize; ++h) {
    const int64_t lanes = std::clamp<int64_t>(n - h * kNativePacketSize, 0, kNativePacketSize);
    if (lanes == kNativePacketSize) {
      Eigen::internal::pstoreu(p + h * kNativePacketSize, x.part[h]);
    } else if (lanes > 0) {
      store_first<NativePacket>(p + h * kNativePacketSize, x.part[h], lanes);
    }
  }
}
#endif

// n (1 <= n <= lanes of P) floats at p as a packet: a whole packet, or the
// first n lanes through load_first / store_first, for loops over a row that
// end in a partial packet.
template <class P = Packet>
inline P load_upto(const Scalar* p, int64_t n) {
  return n == Eigen::internal::unpacket_traits<P>::size ? Eigen::internal::ploadu<P>(p) : load_first<P>(p, n);
}
template <class P = Packet>
inline void store_upto(Scalar* p, const P& x, int64_t n) {
  if (n == Eigen::internal::unpacket_traits<P>::size) {
    Eigen::internal::pstoreu(p, x);
  } else {
    store_first<P>(p, x, n);
  }
}

namespace detail {
// The 16 lanes folded in halves: lanes i and i + 8, then i and i + 4, i and
// i + 2, and the last two; the same adds (or maxima) on every width.
template <class Op>
inline Scalar fold16(const Packet& x, Op op) {
  alignas(64) Scalar v[kPacketSize];
  Eigen::internal::pstore(v, x);
  for (int w = kPacketSize / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) v[i] = op(v[i], v[i + w]);
  return v[0];
}
}  // namespace detail

// The sum of x's 16 lanes, in the canonical tree:
//   ((s0 + s8) + (s4 + s12)) ... : s8[i] = x[i] + x[i + 8], s4[i] = s8[i] + s8[i + 4], ...
inline Scalar sum(const Packet& x) {
#if defined(EIGEN_VECTORIZE_AVX512) || defined(EIGEN_VECTORIZE_AVX)
#if defined(EIGEN_VECTORIZE_AVX512)
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
#else
  const __m256 s8 = _mm256_add_ps(x.part[0], x.part[1]);
#endif
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
#else
  return detail::fold16(x, [](Scalar a, Scalar b) { return a + b; });
#endif
}
// The largest of x's 16 lanes (std::max's choice between equal lanes, in the same tree).
// max_ps(b, a) is b > a ? b : a, which is a < b ? b : a for every pair (NaN
// and equal lanes included): the scalar fold's choice, in registers.
inline Scalar max_of(const Packet& x) {
#if defined(EIGEN_VECTORIZE_AVX512) || defined(EIGEN_VECTORIZE_AVX)
#if defined(EIGEN_VECTORIZE_AVX512)
  const __m256 m8 = _mm256_max_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)), _mm512_castps512_ps256(x));
#else
  const __m256 m8 = _mm256_max_ps(x.part[1], x.part[0]);
#endif
  const __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m8, 1), _mm256_castps256_ps128(m8));
  const __m128 m2 = _mm_max_ps(_mm_movehl_ps(m4, m4), m4);
  return _mm_cvtss_f32(_mm_max_ss(_mm_shuffle_ps(m2, m2, 1), m2));
#else
  return detail::fold16(x, [](Scalar a, Scalar b) { return a < b ? b : a; });
#endif
}

namespace detail {
// e^x for one register: Cephes' polynomial on r = x - m ln 2 with
// m = floor(x log2(e) + 1/2), times 2^m built in the exponent bits; inputs
// clamped to +-88.376 (e^x then 0 below, and inf above through the final
// max with x). The same operations, fused multiply-adds included, for every
// register width.
template <class P>
inline P exp_native(const P& x_in) {
  using namespace Eigen::internal;
  using PI = typename unpacket_traits<P>::integer_packet;
  const P x = pmax(pmin(x_in, pset1<P>(88.3762626647950f)), pset1<P>(-88.3762626647949f));
  const P m = pfloor(pmadd(x, pset1<P>(1.44269504088896341f), pset1<P>(0.5f)));
  const P r = pmadd(m, pset1<P>(-0.6931471805599453f), x);
  const P r2 = pmul(r, r), r3 = pmul(r2, r);
  P y = pmadd(pset1<P>(1.9875691500E-4f), r, pset1<P>(1.3981999507E-3f));
  P y1 = pmadd(pset1<P>(4.1665795894E-2f), r, pset1<P>(1.6666665459E-1f));
  const P y2 = padd(r, pset1<P>(1.0f));
  y = pmadd(y, r, pset1<P>(8.3334519073E-3f));
  y1 = pmadd(y1, r, pset1<P>(5.0000001201E-1f));
  y = pmadd(y, r3, y1);
  y = pmadd(y, r2, y2);
  const PI e = plogical_shift_left<23>(pcast<P, PI>(padd(m, pset1<P>(127.0f))));
  return pmax(pmul(y, preinterpret<P>(e)), x_in);
}

// f applied to each register of x (Packet or NativePacket).
template <class P, class F>
inline P per_register(const P& x, F&& f) {
#if !defined(EIGEN_VECTORIZE_AVX512)
  if constexpr (std::is_same_v<P, Packet>) {
    Packet r;
    for (int h = 0; h < kPacketSize / kNativePacketSize; ++h) r.part[h] = f(x.part[h]);
    return r;
  } else
#endif
  {
    return f(x);
  }
}
}  // namespace detail

// e^x, tanh(x), log(x) lane by lane, the same bits for every width and for
// Packet and NativePacket alike (the GEMM's epilogue and the row loops).
template <class P>
inline P exp(const P& x) {
  return detail::per_register(x, [](const auto& r) { return detail::exp_native(r); });
}
template <class P>
inline P tanh(const P& x) {
  return detail::per_register(x, [](const auto& r) { return Eigen::internal::generic_fast_tanh_float(r); });
}
template <class P>
inline P log(const P& x) {
  return detail::per_register(x, [](const auto& r) { return Eigen::internal::plog_float(r); });
}

}  // namespace tapeformer::eigen
