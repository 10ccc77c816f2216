// The bf16 matrix product (precision.h) behind gemm(): an internal header of
// core/kernels/, for matmul.cpp.
#pragma once

#include <cstdint>

#include "tapeformer/core/kernels/matref.h"
#include "tapeformer/core/storage.h"

namespace tapeformer::kernels {

// C[M, N] (+)= A[M, K] B[K, N] (+ bias[j] in every row), operands rounded to
// bf16 (to_bf16) and multiplied by AVX512-BF16's dot product, summed as
// precision.h says: the pairs (k = 2p, 2p + 1) in order, the odd product
// first, denormals flushed. A and B may have any strides. Single-threaded;
// the caller checked bf16_unsupported().
void gemm_bf16(const MatRef& a, const MatRef& b, Scalar* c, int64_t ldc, bool accumulate, const Scalar* bias);

// The state of the MXCSR's flush-to-zero and denormals-are-zero bits set for
// a scope, restored at its end: the float32 kernel then flushes denormal sums
// as the dot-product instruction does.
class FlushDenormals {
 public:
  FlushDenormals();
  ~FlushDenormals();
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned int saved_;
};

}  // namespace tapeformer::kernels
