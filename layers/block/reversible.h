// The reversible stack (RevNet, Gomez et al. 2017; Reformer, Kitaev et al.
// 2020 §3): each layer is a coupling of two streams of full width C,
//
//   Y1 = X1 + F(X2),  F = attn(ln_1(.))             (B, T, C) each
//   Y2 = X2 + G(Y1),  G = mlp(ln_2(.))
//
// with X1 = X2 = the embeddings into the first layer and (Y1 + Y2) / 2 out of
// the last (into ln_f). The layers are TransformerBlocks, so the parameters
// (and their checkpoint keys) are the standard stack's.
//
// Memory: the forward keeps only the last layer's (Y1, Y2). The backward
// walks the layers from last to first, rebuilding each layer's inputs from
// its outputs, X2 = Y2 - G(Y1), X1 = Y1 - F(X2), and re-running F and G on a
// nested tape to backpropagate (docs/math.md#reversible-backward), so activation memory does not
// grow with n_layer; each branch runs twice (about 1.3-1.5x the time).
// Dropout masks are replayed: each branch's Rng is copied before it runs and
// the copy drives the recomputation.
//
// model.ff_chunks = n (docs/math.md#chunked-feed-forward): G runs over n slices of the sequence
// one at a time, in the forward and in the backward, so its (B, T, 4C)
// hidden layer is never whole; outputs are the same, parameter gradients
// differ only by summation order.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "tapeformer/layers/block/standard.h"

namespace tapeformer {

class ReversibleStack : public BlockStack {
 public:
  ReversibleStack(const ModelConfig& cfg, const Positional& positional, Rng& rng);
  Var forward(const Var& x, Rng& rng) const override;  // (B, T, C) -> (B, T, C)
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const override;
  Var forward(const Var& x, InferenceState& state) const override;

  // Y2 = X2 + G(Y1), G over ff_chunks slices of T; (B, T, C) each.
  Var ff_coupling(const TransformerBlock& block, const Var& x2, const Var& y1, Rng& rng) const;

  std::vector<std::shared_ptr<TransformerBlock>> blocks;  // registered as "0", "1", ...
  int64_t ff_chunks = 1;
  // Called by the backward with each layer's rebuilt inputs (X1, X2), last
  // layer first: for tests and diagnostics of the reconstruction error.
  std::function<void(size_t layer, const Tensor& x1, const Tensor& x2)> on_rebuilt;
};

}  // namespace tapeformer
