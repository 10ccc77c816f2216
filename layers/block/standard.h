// The standard stack: nanoGPT's pre-LN residual blocks, and the pieces every
// block kind shares (the block's two branches).
//
//   per layer:  x = x + F(x),  F = attn(ln_1(.))     (B, T, C)
//               x = x + G(x),  G = mlp(ln_2(.))      (B, T, C)
//
// Its backward keeps every layer's activations (the tape): memory grows with
// n_layer. The reversible stack (layers/block/reversible.h) wires the same
// blocks as couplings and keeps only its outputs.
#pragma once

#include <memory>
#include <vector>

#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/basic.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/block/sequential.h"
#include "tapeformer/layers/mlp.h"

namespace tapeformer {

// attn(ln(x)) attending also to ln(memory) (B, M, C) when memory holds rows:
// the pre-LN attention branch of the standard and gated blocks.
Var attend_normalised(const Attention& attn, const LayerNorm& ln, const Var& x, const Tensor& memory, Rng& rng);

// ln over the rows `rows` (flat b * T + t, ascending) of x (B, T, C) ->
// (1, R, C), each ln.forward(x)'s row bit for bit.
Var norm_rows(const LayerNorm& ln, const Var& x, const std::vector<int64_t>& rows);

// One layer's parameters: ln_1, attn (cfg.attention's kind, `positional`'s
// part inside), ln_2, mlp (cfg.mlp's kind, layers/mlp.h); keys "ln_1.weight", "attn.qkv.weight", ...
class TransformerBlock : public Module {
 public:
  TransformerBlock(const ModelConfig& cfg, const Positional& positional, Rng& rng);
  // The residual branches: F(x) = attn(ln_1(x)), G(x) = mlp(ln_2(x)), (B, T, C) -> (B, T, C).
  Var attention_branch(const Var& x, Rng& rng) const { return attn->forward(ln_1->forward(x), rng); }
  // F over x with this layer's Transformer-XL memory (B, M, C), normalised like x; none when undefined.
  Var attention_branch(const Var& x, const Tensor& memory, Rng& rng) const {
    return attend_normalised(*attn, *ln_1, x, memory, rng);
  }
  Var attention_branch(const Var& x, InferenceState& state) const { return attn->forward(ln_1->forward(x), state); }
  Var ff_branch(const Var& x, Rng& rng) const { return mlp->forward(ln_2->forward(x), rng); }
  // Content attention of x's queries over memory rows (B, N, C), both
  // normalised as the branch does, every weight held fixed (the
  // Compressive Transformer's reconstruction target).
  Var content_attention(const Var& x, const Var& rows) const {
    return attn->content_attention(ln_1->forward_fixed(detach(x)), ln_1->forward_fixed(rows));
  }
  // The pre-LN block: x + F(x), then + G of that.
  Var forward(const Var& x, Rng& rng) const;  // (B, T, C) -> (B, T, C)
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const;
  Var forward(const Var& x, InferenceState& state) const;  // (B, T, C) -> (B, T, C)
  // The same when only `rows` (flat b * T + t, ascending) need the layer's
  // output, the other positions having left (early exit) or halted (ACT):
  // every position of x enters the attention's state (later positions read
  // its keys), the rows get forward(x, state)'s values bit for bit, the
  // others keep x's. The MLP and the attention's output run for the rows
  // alone (Attention::forward_rows). (B, T, C) -> (B, T, C)
  Var forward_rows(const Var& x, InferenceState& state, const std::vector<int64_t>& rows) const;
  // With a Transformer-XL memory of this layer's inputs (B, M, C), no gradient.
  Var forward(const Var& x, const Tensor& memory, Rng& rng) const;  // (B, T, C) -> (B, T, C)
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<Mlp> mlp;
};

// Parameters of one TransformerBlock, its positional part excluded.
double transformer_block_parameters(const ModelConfig& cfg);
// The same for n_layer of them (the standard and post-LN stacks; parameters
// include the memories', a learned compression's and an external memory's gates).
double transformer_stack_parameters(const ModelConfig& cfg);

using StandardStack = SequentialStack<TransformerBlock>;

}  // namespace tapeformer
