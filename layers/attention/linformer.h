// Linformer (Wang et al. 2020), the "linformer" attention kind:
// keys and values projected along the sequence to a fixed length k, so
// attention costs O(T k) instead of O(T^2):
//
//   K' = E_T K,  V' = F_T V    E, F (k, n) learned, n = model.block_size,
//                              E_T = E[:, :T] (a shorter sequence is n padded with zeros)
//   y_h = softmax(q_h K'_h^T / sqrt(D)) V'_h                         (B, H, T, D)
//
// model.linformer_k = k (default 32); model.linformer_sharing: "headwise"
// (one E and one F per layer, shared by the heads; the paper's default),
// "kv" (E = F) or "none" (E and F per head). (The paper's layer-wise
// sharing, one matrix for every layer, would need parameters shared across
// layers, which the model's per-layer modules do not have.)
//
// It is not causal: E K mixes every position, future ones included, into
// every projected key. A causal language model refuses it (its check names
// why); a model with ModelConfig::causal = false (set in C++, e.g. the
// encoder of examples/linformer_encoder.cpp) uses it, and there is no
// generation state to make.
#pragma once

#include <memory>
#include <string>

#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/projected.h"
#include "tapeformer/layers/basic.h"

namespace tapeformer {

class LinformerAttention : public ProjectedAttention {
 public:
  // Reads n_embd, n_head, bias, dropout, block_size and the linformer options; needs cfg.causal false.
  LinformerAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng);
  Var forward(const Var& x, Rng& rng) const override;  // (B, T, C) -> (B, T, C), T <= block_size, not causal

  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const override;  // Error: not causal
  Var forward(const Var& x, InferenceState& state) const override;                          // Error: not causal

  int64_t n, k;
  std::string sharing;
  Var E, F;  // (k, n), or (H, k, n) with sharing "none"; F is E with sharing "kv"

 private:
  // x (B, H, T, D) projected along T: (B, H, k, D).
  Var project(const Var& P, const Var& x) const;
};

}  // namespace tapeformer
