// The Memorizing Transformer's external memory (Wu et al. 2022): one layer's
// keys and values at past positions, searched for each query's top k and
// attended to without gradient into the memory.
//
//   ExternalMemory mem{&keys, &values, /*capacity=*/1024, /*top_k=*/32};
//   const Var y = retrieved_attention(q, mem, log_scale);  // q (B, H, T, D), log_scale (H) -> (B, H, T, D)
//   mem.append(k_new, v_new);                     // (B, H, T, D) each; the oldest dropped past capacity
//
// Keys are stored as unit vectors, and queries are normalised too (the
// paper's remedy for keys written under older weights): for query q_i (per
// sequence and head h) with retrieved pairs (k_j, v_j), j in top_k(q_i . K)
// over the N stored keys (exact search, i.e. by cosine),
//
//   y_i = sum_j softmax_j(tau_h (q_i / |q_i|) . k_j) v_j,   tau_h = exp(s_h)
//
// with s (H) a learned log temperature (the layer's xmem_scale). Cosine
// scores keep the attention diffuse where no key matches and sharp where
// one does. The pairs are constants (no gradient to past positions, the
// paper's non-differentiable memory); q and s get theirs through the scores.
// The memory layer mixes y with its local attention by a learned gate per
// head (memorizing.h, MemorizingAttention).
//
// Storage: keys and values are (B, N, C) tensors with the heads side by side
// (head h in columns [hD, (h+1)D)), the layout of a segment memory's rows, so
// sharding, gathering and checkpoints treat them as they treat those.
#pragma once

#include <cstdint>
#include <vector>

#include "tapeformer/autograd/var.h"

namespace tapeformer {

struct ExternalMemory {
  Tensor* keys = nullptr;    // (B, N, C), oldest first; undefined before the first append
  Tensor* values = nullptr;  // (B, N, C)
  int64_t capacity = 0;      // model.xmem_len: N never exceeds it
  int64_t top_k = 32;        // model.xmem_topk: pairs retrieved per query (fewer while N < top_k)

  int64_t length() const { return keys == nullptr || !keys->defined() ? 0 : keys->dim(1); }
  // k, v (B, H, T, D) of T new positions appended (each key scaled to unit length);
  // past capacity the oldest drop out.
  void append(const Tensor& k, const Tensor& v);
  // For each query of q (B, H, T, D), the indices of its min(top_k, N) best keys by
  // dot product, (B, H, T, k) row-major, ties to the lower index.
  std::vector<int32_t> search(const Tensor& q) const;
};

// Attention of q (B, H, T, D) over the pairs `memory` retrieves for it, at
// temperature exp(log_scale) (H) per head -> (B, H, T, D). The memory must
// hold at least one position.
Var retrieved_attention(const Var& q, const ExternalMemory& memory, const Var& log_scale);

}  // namespace tapeformer
