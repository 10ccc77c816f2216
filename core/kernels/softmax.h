// Row-wise softmax family over the last axis of a [rows, n] buffer.
// Forward and backward sit side by side; all are parallel over rows.
#pragma once

#include <cstdint>

#include "tapeformer/core/storage.h"

namespace tapeformer::kernels {

// y = exp(x - max) / sum exp(x - max)                          (rows, n)
void softmax_rows(const Scalar* x, Scalar* y, int64_t rows, int64_t n);
// dx = y * (dy - sum_j y_j dy_j)
void softmax_backward_rows(const Scalar* y, const Scalar* dy, Scalar* dx, int64_t rows, int64_t n);

// y = x - max - log sum exp(x - max)
void log_softmax_rows(const Scalar* x, Scalar* y, int64_t rows, int64_t n);
// dx = dy - exp(y) * sum_j dy_j
void log_softmax_backward_rows(const Scalar* y, const Scalar* dy, Scalar* dx, int64_t rows,
                               int64_t n);

// Fused cross-entropy over logits (rows, V) and integer targets (rows).
// Rows whose target == ignore_index contribute nothing. Writes each row's
// logsumexp to lse (rows) and returns the summed NLL (in double) and, in
// *counted, the number of rows that were not ignored.
double cross_entropy_rows(const Scalar* logits, const int32_t* targets, Scalar* lse, int64_t rows,
                          int64_t V, int32_t ignore_index, int64_t* counted);
// dlogits = scale * (softmax(logits) - onehot(target)), 0 for ignored rows.
void cross_entropy_backward_rows(const Scalar* logits, const int32_t* targets, const Scalar* lse,
                                 Scalar scale, Scalar* dlogits, int64_t rows, int64_t V,
                                 int32_t ignore_index);

}  // namespace tapeformer::kernels
