// A matrix operand of the products (matmul.h), by pointer and strides.
#pragma once

#include <cstdint>

#include "tapeformer/core/storage.h"

namespace tapeformer::kernels {

// One matrix operand: element (i, j) is data[i * row_stride + j * col_stride].
// Either stride must be 1 (row-major, or a transposed view of row-major).
struct MatRef {
  const Scalar* data;
  int64_t rows, cols;
  int64_t row_stride, col_stride;
};

}  // namespace tapeformer::kernels
