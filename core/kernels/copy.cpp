#include "core/kernels/copy.h"

#include <cstring>

namespace tapeformer::kernels {
namespace {

void copy_rec(const Scalar* src, const Strides& ss, Scalar* dst, const Strides& ds,
              const Shape& shape, int axis) {
  const int64_t n = shape[axis];
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
  if (shape.numel() == 0) return;
  if (shape.rank() == 0) {
    *dst = *src;
    return;
  }
  copy_rec(src, src_strides, dst, dst_strides, shape, 0);
}

}  // namespace tapeformer::kernels
