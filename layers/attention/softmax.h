// Softmax attention (Vaswani et al. 2017; docs/math.md#softmax-attention), the
// "softmax" attention kind: multi-head scaled dot-product self-attention,
// causal (or bidirectional for an encoder, ModelConfig::causal = false).
//
//   MultiHeadAttention attn(/*n_embd=*/128, /*n_head=*/4, /*bias=*/true, /*dropout=*/0.0f,
//                           /*proj_init_std=*/0.02f / std::sqrt(2.0f * n_layer), rng);
//   Var y = attn.forward(x, rng);    // (B, T, C) -> (B, T, C)
//
// q, k, v come from one fused [C, 3C] projection; head h owns columns
// [h*D, (h+1)*D) of each of q, k, v. y_i = sum_{j <= i} softmax_j(q_i k_j /
// sqrt(D) + bias_ij) v_j per head, then the output projection.
// Which kernel runs:
//   - no positional terms and T <= kFusedMaxT: the fused kernel that keeps
//     the T x T probabilities for the backward (autograd `causal_attention`;
//     fastest at short T);
//   - rotations (RoPE), score biases (ALiBi) or longer T: the memory-lean
//     kernel (`softmax_attention`, O(T) saved per head, so one layer at
//     N = 8192 trains on a laptop), with ALiBi's bias terms passed in;
//   - learned relative terms (Shaw): scores composed from primitive ops
//     (T x T), the relative terms added where the math puts them.
// `composed_attention` is the same math built from primitive ops, kept as the
// reference the tests compare the kernels with.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/projected.h"
#include "tapeformer/layers/attention/sparse.h"
#include "tapeformer/layers/basic.h"

namespace tapeformer {

// softmax(q k^T / sqrt(D) + mask) v with optional dropout on the probabilities.
// q, k, v: (B, H, T, D) (views are fine). Returns (B, H, T, D).
Var scaled_dot_product_attention(const Var& q, const Var& k, const Var& v, bool causal,
                                 float dropout_p, Rng* rng);

// The composition of primitives that causal_attention fuses: qkv (B, T, 3C) -> (B, T, C).
Var composed_attention(const Var& qkv, int64_t n_head, bool causal, float dropout_p, Rng* rng);

// Keys and values of the last positions a softmax attention layer has seen.
//
//   KVCache cache(/*batch=*/1, /*heads=*/4, /*head_dim=*/32, /*window=*/64);
//   auto [k, v, k0] = cache.append(k_new, v_new);   // views of the window
//
// It keeps at most `window` positions (-1: all): appending past that drops
// the oldest, so a long generation costs O(window) per token, and keys keep
// the absolute positions they were inserted at (RoPE keys are rotated once).
class KVCache : public InferenceState {
 public:
  KVCache(int64_t batch, int64_t n_head, int64_t head_dim, int64_t window);
  std::string name() const override { return "KVCache"; }
  int64_t length() const override { return seen_; }  // positions seen
  void reset() override { seen_ = held_ = 0; }
  int64_t held() const { return held_; }  // positions in the window now
  int64_t window() const { return window_; }

  struct Window {
    Tensor k, v;    // (B, H, held, D) each
    int64_t start;  // absolute position of the first held key
  };
  // Appends k, v (B, H, T, D) after the positions seen and returns the window.
  Window append(const Tensor& k, const Tensor& v);

 private:
  void reserve(int64_t n);
  int64_t batch_, heads_, dim_, window_;
  Tensor k_, v_;  // (B, H, capacity, D), the first held_ positions in use
  int64_t seen_ = 0, held_ = 0;
};

class MultiHeadAttention : public ProjectedAttention {
 public:
  // Longest T that runs the fused kernel keeping the (T, T) probabilities.
  static constexpr int64_t kFusedMaxT = 256;

  // With a `pattern`, query i sees only the keys it lists (the sparse kinds,
  // layers/attention/sparse.h), through the block-sparse kernel. With
  // causal false (dense only) every query sees every key: an encoder's
  // layer, with no inference state and no Transformer-XL memory.
  MultiHeadAttention(int64_t n_embd, int64_t n_head, bool bias, float dropout, float proj_init_std, Rng& rng,
                     std::shared_ptr<PositionalLayer> pos = std::make_shared<PositionalLayer>(),
                     std::shared_ptr<const SparsePattern> pattern = nullptr, bool causal = true);
  Var forward(const Var& x, Rng& rng) const override;  // (B, T, C) -> (B, T, C)

  // Inference: a KVCache of the last `window` positions. From an empty cache
  // the outputs equal forward()'s bit for bit (the same kernels); positions
  // after cached ones attend through the offset causal mask, equal to float
  // rounding.
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const override;
  Var forward(const Var& x, InferenceState& state) const override;  // (B, T, C) -> (B, T, C)
  // Only `rows` computed past the cache: the keys and values alone when rows
  // is empty (2/3 of the qkv projection), the fused kernel's rows
  // (kernels::causal_attention_rows) when forward(x, state) would run it,
  // otherwise every row attended and `rows` projected. (B, T, C) -> (1, R, C).
  Var forward_rows(const Var& x, InferenceState& state, const std::vector<int64_t>& rows) const override;
  // With a Transformer-XL memory (B, M, C): its keys and values come from the
  // k and v columns of the qkv projection only (no queries for memory rows).
  Var forward(const Var& x, const Var& memory, Rng& rng) const override;  // (B, T, C) -> (B, T, C)
  Var content_attention(const Var& x, const Var& rows) const override;     // (B, T, C), (B, N, C) -> (B, T, C)
  // Its attention before the output projection and the heads it read, for
  // a wrapper (ProjectedAttention::attend_with_heads).
  Attended attend_with_heads(const Var& x, const Var& memory, Rng& rng) const override;

 private:
  // Attention of the segment's q, k, v (qkv_x (B, T, 3C)) over itself and
  // the Transformer-XL memory (B, M, C; none when undefined or empty),
  // before the output projection -> (B, T, C).
  Var local_attention(const Var& qkv_x, const Var& memory, float p, Rng& rng) const;
  // Self-attention of a whole sequence from its packed projection, (B, T, 3C) -> (B, T, C).
  Var self_attention(const Var& qkv_x, float p, Rng* rng) const;
  // q (B, H, Tq, D) at positions q0.. over k, v (B, H, Tk, D) at k0.. (causal unless causal_ is false),
  // -> (B, H, Tq, D).
  Var attend(const Var& q, const Var& k, const Var& v, int64_t q0, int64_t k0, float p, Rng* rng) const;
  bool plain() const;  // no positional terms inside the layer, dense
  // A head group's tiles for queries at q0.. over keys at k0.., built once per shape and kept.
  std::shared_ptr<const kernels::BlockMask> tiles(int64_t group, const SparsePattern& p, int64_t Tq, int64_t Tk,
                                                      int64_t q0, int64_t k0) const;

  std::shared_ptr<const SparsePattern> pattern_;  // null: dense
  bool causal_;
  TileCache tiles_;  // by (head group, Tq, Tk, q0, k0)
};

}  // namespace tapeformer
