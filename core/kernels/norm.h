// Fused normalisations over the last axis of a [rows, C] buffer.
#pragma once

#include <cstdint>

#include "tapeformer/core/storage.h"

namespace tapeformer::kernels {

// LayerNorm: xhat = (x - mean) * rstd, rstd = (var + eps)^-1/2, y = gamma * xhat + beta.
// gamma/beta may be null (no affine). Saves mean and rstd (rows) for backward.
void layer_norm_rows(const Scalar* x, const Scalar* gamma, const Scalar* beta, Scalar* y,
                     Scalar* mean, Scalar* rstd, int64_t rows, int64_t C, Scalar eps);
// The forward's y again from x and its saved mean and rstd, bit for bit.
void layer_norm_apply_rows(const Scalar* x, const Scalar* gamma, const Scalar* beta, const Scalar* mean,
                           const Scalar* rstd, Scalar* y, int64_t rows, int64_t C);
// g = dy * gamma; dx = rstd * (g - mean(g) - xhat * mean(g * xhat));
// dgamma += sum_rows dy * xhat; dbeta += sum_rows dy (either may be null).
void layer_norm_backward_rows(const Scalar* dy, const Scalar* x, const Scalar* gamma,
                              const Scalar* mean, const Scalar* rstd, Scalar* dx, Scalar* dgamma,
                              Scalar* dbeta, int64_t rows, int64_t C);

// RMSNorm: r = (mean(x^2) + eps)^-1/2, y = gamma * x * r. Saves r (rows).
void rms_norm_rows(const Scalar* x, const Scalar* gamma, Scalar* y, Scalar* rstd, int64_t rows,
                   int64_t C, Scalar eps);
// g = dy * gamma; dx = r * (g - xhat * mean(g * xhat)) with xhat = x * r;
// dgamma += sum_rows dy * xhat.
void rms_norm_backward_rows(const Scalar* dy, const Scalar* x, const Scalar* gamma,
                            const Scalar* rstd, Scalar* dx, Scalar* dgamma, int64_t rows,
                            int64_t C);

}  // namespace tapeformer::kernels
