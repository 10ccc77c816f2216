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
#include <string>
#include <utility>

#include "layers/basic.h"
#include "layers/inference_state.h"

namespace tapeformer {

// softmax(q k^T / sqrt(D) + mask) v with optional dropout on the probabilities.
// q, k, v: (B, H, T, D) (views are fine). Returns (B, H, T, D).
Var scaled_dot_product_attention(const Var& q, const Var& k, const Var& v, bool causal,
                                 float dropout_p, Rng* rng);

// The composition of primitives that causal_attention fuses: qkv (B, T, 3C) -> (B, T, C).
Var composed_attention(const Var& qkv, int64_t n_head, bool causal, float dropout_p, Rng* rng);

// Keys and values of the M positions a causal attention layer has seen, so
// a new position attends to the past without recomputing it.
//
//   auto cache = attn.make_cache(/*batch=*/1, /*capacity=*/64);
//   Var y = attn.forward(x_prompt, *cache);   // (1, T, C); cache->length() == T
//   y = attn.forward(x_next, *cache);         // (1, 1, C), attends to all T + 1
class KVCache : public InferenceState {
 public:
  KVCache(int64_t batch, int64_t n_head, int64_t head_dim, int64_t capacity);
  std::string name() const override { return "KVCache"; }
  int64_t length() const override { return length_; }
  void reset() override { length_ = 0; }
  int64_t capacity() const { return k_.dim(2); }
  // Appends k, v (B, H, T, D) after the M cached positions and returns views
  // of all keys and values so far, (B, H, M + T, D) each.
  std::pair<Tensor, Tensor> append(const Tensor& k, const Tensor& v);

 private:
  Tensor k_, v_;  // (B, H, capacity, D)
  int64_t length_ = 0;
};

class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(int64_t n_embd, int64_t n_head, bool bias, float dropout,
                     float proj_init_std, Rng& rng, bool causal = true);
  Var forward(const Var& x, Rng& rng) const;  // (B, T, C) -> (B, T, C)

  // Inference, causal only: x (B, T, C) holds the T positions after the
  // cache's M; they attend to the cached ones and causally to each other, and
  // their keys and values join the cache. Equals the matching rows of
  // forward() on the whole sequence: bit for bit from an empty cache (the
  // same fused kernel), to float rounding after cached positions. Needs
  // NoGradGuard and eval mode.
  std::unique_ptr<KVCache> make_cache(int64_t batch, int64_t capacity) const;
  Var forward(const Var& x, KVCache& cache) const;  // (B, T, C) -> (B, T, C)

  int64_t n_embd, n_head;
  float dropout_p;
  bool causal;
  std::shared_ptr<Linear> qkv, proj;
  std::shared_ptr<Dropout> resid_drop;
};

}  // namespace tapeformer
