// GTrXL blocks (Parisotto et al. 2020 §3): the identity-map
// reordering of TrXL-I (layer norm on each branch's input only, a ReLU on
// each branch's output) with the residual sums replaced by gates:
//
//   Y  = gate_1(E, ReLU(attn(ln_1(E))))        (B, T, C)
//   E' = gate_2(Y, ReLU(mlp(ln_2(Y))))
//
// model.gate picks the gate (layers/block/gates.h; "none" is TrXL-I itself,
// "gru" the default) and model.gate_bias its b_g (default 2, the paper's value
// for the GRU gate; it used 1 for the others). There is an identity path
// from the embeddings to ln_f, and with b_g > 0 each block starts near it.
#pragma once

#include <memory>
#include <vector>

#include "tapeformer/layers/block/gates.h"
#include "tapeformer/layers/block/standard.h"

namespace tapeformer {

class GatedBlock : public Module {
 public:
  GatedBlock(const ModelConfig& cfg, const Positional& positional, Rng& rng);
  Var forward(const Var& x, Rng& rng) const;  // (B, T, C) -> (B, T, C)
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const {
    return attn->make_state(batch, window);
  }
  Var forward(const Var& x, InferenceState& state) const;
  // With a Transformer-XL memory of this layer's inputs (B, M, C), no gradient.
  Var forward(const Var& x, const Tensor& memory, Rng& rng) const;
  // As TransformerBlock::content_attention (the same pre-LN attention branch).
  Var content_attention(const Var& x, const Var& rows) const {
    return attn->content_attention(ln_1->forward_fixed(detach(x)), ln_1->forward_fixed(rows));
  }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<Mlp> mlp;
  std::shared_ptr<Gate> gate_1, gate_2;
};

using GatedStack = SequentialStack<GatedBlock>;

}  // namespace tapeformer
