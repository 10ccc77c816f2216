// Activations with their derivatives: the gelu/relu/silu ops and the GEMM
// epilogue that fuses an activation into a linear layer (feed_forward) share
// one packet implementation (activation_packet.h).
//
//   kernels::activate_rows(Activation::Gelu, y, dydx, n);  // y = gelu(y), dydx = gelu'(y), in place
//
// The gelu/relu/silu ops keep the derivative instead of their input: the
// backward is then one multiply. The fused feed_forward keeps only the
// input z and its backward recomputes act(z) and act'(z) here: the same
// packet math as the epilogue's, so the same bits, for one buffer of F
// floats per row instead of two.
#pragma once

#include <cstdint>

#include "tapeformer/core/storage.h"

namespace tapeformer {

enum class Activation { Gelu, Relu, Silu };

namespace kernels {

// y[i] = act(y[i]) and dydx[i] = act'(y[i]) for i < n (dydx may be null).
void activate_rows(Activation act, Scalar* y, Scalar* dydx, int64_t n);

}  // namespace kernels
}  // namespace tapeformer
