#include "tapeformer/core/kernels/copy.h"

#include <cstring>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/profile.h"

namespace tapeformer::kernels {
namespace {

// dst (rows, cols) with unit column stride from src with unit row stride: a
// transpose. Square blocks of one packet's width are loaded as packets (one
// per source column), transposed in registers and stored as packets (one per
// destination row); the plain element loop read one float per source cache
// line and was ~4x slower on a 128 x 384 weight.
void transpose_2d(const Scalar* src, int64_t src_cs, Scalar* dst, int64_t dst_rs, int64_t rows, int64_t cols) {
  using namespace Eigen::internal;
  using Packet = eigen::NativePacket;
  constexpr int64_t L = eigen::kNativePacketSize;
  auto scalar_block = [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t i = i0; i < i1; ++i) dst[i * dst_rs + j] = src[i + j * src_cs];
  };
  int64_t i0 = 0;
  for (; i0 + L <= rows; i0 += L) {
    int64_t j0 = 0;
    for (; j0 + L <= cols; j0 += L) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"  // Packet is a vector type such as __m512
      PacketBlock<Packet, L> block;
#pragma GCC diagnostic pop
      for (int64_t r = 0; r < L; ++r) block.packet[r] = ploadu<Packet>(src + i0 + (j0 + r) * src_cs);
      ptranspose(block);
      for (int64_t r = 0; r < L; ++r) pstoreu(dst + (i0 + r) * dst_rs + j0, block.packet[r]);
    }
    scalar_block(i0, i0 + L, j0, cols);
  }
  scalar_block(i0, rows, 0, cols);
}

void copy_rec(const Scalar* src, const Strides& ss, Scalar* dst, const Strides& ds,
              const Shape& shape, int axis) {
  const int64_t n = shape[axis];
  if (axis == shape.rank() - 2 && ss[axis] == 1 && ss[axis + 1] != 1 && ds[axis + 1] == 1) {
    transpose_2d(src, ss[axis + 1], dst, ds[axis], n, shape[axis + 1]);
    return;
  }
  if (axis == shape.rank() - 1) {
    const int64_t s = ss[axis], d = ds[axis];
    if (s == 1 && d == 1) {
      std::memcpy(dst, src, sizeof(Scalar) * n);
    } else if (s == 0) {
      for (int64_t i = 0; i < n; ++i) dst[i * d] = *src;
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i * d] = src[i * s];
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) copy_rec(src + i * ss[axis], ss, dst + i * ds[axis], ds, shape, axis + 1);
}

}  // namespace

void strided_copy(const Scalar* src, const Strides& src_strides, Scalar* dst,
                  const Strides& dst_strides, const Shape& shape) {
  const profile::Scope timed("copy");
  if (shape.numel() == 0) return;
  if (shape.rank() == 0) {
    *dst = *src;
    return;
  }
  copy_rec(src, src_strides, dst, dst_strides, shape, 0);
}

}  // namespace tapeformer::kernels
