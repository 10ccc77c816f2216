// Multi-head scaled dot-product self-attention (SPEC §1), causal by default.
//
//   MultiHeadAttention attn(/*n_embd=*/128, /*n_head=*/4, /*bias=*/true, /*dropout=*/0.0f,
//                           /*proj_init_std=*/0.02f / std::sqrt(2.0f * n_layer), rng);
//   Var y = attn.forward(x, rng);    // (B, T, C) -> (B, T, C)
//
// q, k, v come from one fused [C, 3C] projection; head h owns columns
// [h*D, (h+1)*D) of each of q, k, v. Scores are scaled by 1/sqrt(D) and the
// causal mask sets key j > query i to -inf before the softmax, so a token
// sees itself and the past only. Causal attention runs the fused kernel
// (autograd `causal_attention`); `composed_attention` is the same math built
// from primitive ops, kept as its reference (tests compare the two) and used
// for non-causal attention.
#pragma once

#include <memory>

#include "layers/basic.h"

namespace tapeformer {

// softmax(q k^T / sqrt(D) + mask) v with optional dropout on the probabilities.
// q, k, v: (B, H, T, D) (views are fine). Returns (B, H, T, D).
Var scaled_dot_product_attention(const Var& q, const Var& k, const Var& v, bool causal,
                                 float dropout_p, Rng* rng);

// The composition of primitives that causal_attention fuses: qkv (B, T, 3C) -> (B, T, C).
Var composed_attention(const Var& qkv, int64_t n_head, bool causal, float dropout_p, Rng* rng);

class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(int64_t n_embd, int64_t n_head, bool bias, float dropout,
                     float proj_init_std, Rng& rng, bool causal = true);
  Var forward(const Var& x, Rng& rng) const;  // (B, T, C) -> (B, T, C)

  int64_t n_embd, n_head;
  float dropout_p;
  bool causal;
  std::shared_ptr<Linear> qkv, proj;
  std::shared_ptr<Dropout> resid_drop;
};

}  // namespace tapeformer
