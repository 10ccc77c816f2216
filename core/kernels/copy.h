// Strided copy: the one routine that turns any view into a dense array.
#pragma once

#include "tapeformer/core/shape.h"
#include "tapeformer/core/storage.h"

namespace tapeformer::kernels {

// dst[i] = src[i] for every multi-index i of `shape`, both addressed by their
// own element strides (stride 0 allowed on the source for broadcasts).
void strided_copy(const Scalar* src, const Strides& src_strides, Scalar* dst,
                  const Strides& dst_strides, const Shape& shape);

}  // namespace tapeformer::kernels
