// Fused causal multi-head attention over a packed qkv buffer (Vaswani et al. 2017;
// docs/math.md#softmax-attention).
//
// qkv is (B, T, 3C) with columns [q | k | v], head h owning columns
// [h*D, (h+1)*D) of each part; the output y is (B, T, C) with heads merged
// the same way. Work is parallel over (b, h); every (b, h) writes disjoint
// columns, so results do not depend on the thread count.
#pragma once

#include <cstdint>

#include "tapeformer/core/storage.h"

namespace tapeformer::kernels {

struct AttentionShape {
  int64_t B, T, H, D;  // C = H * D
};

// P = softmax(scale * Q K^T + causal mask) per (b, h), saved to probs
// (B, H, T, T; entries j > i are 0). If keep is non-null (B, H, T, T, values
// 0 or 1/(1-p)), O = (P * keep) V, else O = P V.
void causal_attention_forward(const Scalar* qkv, Scalar* y, Scalar* probs, const Scalar* keep,
                              const AttentionShape& s);

// Rows of causal_attention_forward's y without dropout, bit for bit, for
// a reader that needs only some positions' outputs (early exit, ACT halting):
// rows[r] = b * T + t (ascending) -> y_rows (R, C), row r = y's row (b, t).
// The scores and softmax of each row run over the same widths as in the
// whole forward, so every product sums in the same order.
void causal_attention_rows(const Scalar* qkv, const int64_t* rows, int64_t R, Scalar* y_rows, const AttentionShape& s);

// Given dy (B, T, C), writes dqkv (B, T, 3C):
//   dV = P~^T dO, dP~ = dO V^T, dP = dP~ * keep, dS = P * (dP - rowsum(P * dP)),
//   dQ = scale dS K, dK = scale dS^T Q.
void causal_attention_backward(const Scalar* qkv, const Scalar* probs, const Scalar* keep,
                               const Scalar* dy, Scalar* dqkv, const AttentionShape& s);

}  // namespace tapeformer::kernels
