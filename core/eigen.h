// The one bridge between tapeformer buffers and Eigen (STYLE rule 10).
//
//   auto x = eigen::matrix(ptr, rows, cols);          // row-major, contiguous rows
//   auto v = eigen::array(ptr, n);                     // 1-D array for coefficient-wise maps
//   v = v.max(0.0f);                                   // vectorised by Eigen
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <type_traits>

#include "core/storage.h"

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
// With AVX or AVX-512, Eigen has masked packet loads and stores
// (ploadu(p, mask), pstoreu(p, x, mask)); LaneMask holds one bit per lane.
#if defined(EIGEN_VECTORIZE_AVX512) || defined(EIGEN_VECTORIZE_AVX)
inline constexpr bool kHasMaskedPackets = true;
#else
inline constexpr bool kHasMaskedPackets = false;
#endif
using LaneMask = std::conditional_t<(kPacketSize > 8), uint16_t, uint8_t>;
// The first n (< kPacketSize) lanes.
inline LaneMask first_lanes(int64_t n) { return static_cast<LaneMask>((1u << n) - 1); }

}  // namespace tapeformer::eigen
