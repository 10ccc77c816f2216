// The one bridge between tapeformer buffers and Eigen (STYLE rule 10).
//
//   auto x = eigen::matrix(ptr, rows, cols);          // row-major, contiguous rows
//   auto v = eigen::array(ptr, n);                     // 1-D array for coefficient-wise maps
//   v = v.max(0.0f);                                   // vectorised by Eigen
#pragma once

#include <Eigen/Core>
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

// Eigen's packet math, for the few kernels that vectorise by hand (the GEMM,
// transposes, softmax rows): one SIMD register of Scalars for whatever
// instruction set Eigen targets (16 floats with AVX-512).
using Packet = Eigen::internal::packet_traits<Scalar>::type;
inline constexpr int kPacketSize = Eigen::internal::packet_traits<Scalar>::size;
// The first n lanes (0 <= n <= kPacketSize) of p as a packet, the other lanes
// 0, and the store of only those lanes: for the partial last packet of a row.
// Eigen's masked loads and stores with AVX or AVX-512; a copy through a small
// buffer elsewhere. Nothing outside [p, p + n) is read or written.
inline Packet load_first(const Scalar* p, int64_t n) {
#if defined(EIGEN_VECTORIZE_AVX512) || defined(EIGEN_VECTORIZE_AVX)
  using Mask = std::conditional_t<(kPacketSize > 8), uint16_t, uint8_t>;  // Eigen's mask_t: a bit per lane
  return Eigen::internal::ploadu<Packet>(p, static_cast<Mask>((1u << n) - 1));
#else
  alignas(64) Scalar buf[kPacketSize] = {};
  for (int64_t i = 0; i < n; ++i) buf[i] = p[i];
  return Eigen::internal::pload<Packet>(buf);
#endif
}
inline void store_first(Scalar* p, const Packet& x, int64_t n) {
#if defined(EIGEN_VECTORIZE_AVX512) || defined(EIGEN_VECTORIZE_AVX)
  using Mask = std::conditional_t<(kPacketSize > 8), uint16_t, uint8_t>;
  Eigen::internal::pstoreu(p, x, static_cast<Mask>((1u << n) - 1));
#else
  alignas(64) Scalar buf[kPacketSize];
  Eigen::internal::pstore(buf, x);
  for (int64_t i = 0; i < n; ++i) p[i] = buf[i];
#endif
}

// n (1 <= n <= kPacketSize) floats at p as a packet: a whole packet, or the
// first n lanes through load_first / store_first, for loops over a row that
// end in a partial packet.
inline Packet load_upto(const Scalar* p, int64_t n) {
  return n == kPacketSize ? Eigen::internal::ploadu<Packet>(p) : load_first(p, n);
}
inline void store_upto(Scalar* p, const Packet& x, int64_t n) {
  if (n == kPacketSize) {
    Eigen::internal::pstoreu(p, x);
  } else {
    store_first(p, x, n);
  }
}

}  // namespace tapeformer::eigen
