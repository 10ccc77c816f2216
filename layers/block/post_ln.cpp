// The post-LN blocks of the original Transformer and the canonical
// Transformer-XL (the baseline GTrXL's experiments start from):
//
//   x = ln_1(x + attn(x));  x = ln_2(x + mlp(x))       (B, T, C)
//
// The same layers (and checkpoint keys) as the standard stack; only the
// place of the norms differs, so no identity path runs from the embeddings
// to the output.
#include "tapeformer/layers/block/standard.h"

namespace tapeformer {
namespace {

class PostLNBlock : public TransformerBlock {
 public:
  using TransformerBlock::TransformerBlock;
  Var forward(const Var& x_in, Rng& rng) const { return forward(x_in, Tensor(), rng); }
  // Attention::forward(x, memory, rng) is the plain forward when memory is undefined.
  Var forward(const Var& x_in, const Tensor& memory, Rng& rng) const {
    const Var x = ln_1->forward(add(x_in, attn->forward(x_in, memory.defined() ? Var(memory) : Var(), rng)));
    return ln_2->forward(add(x, mlp->forward(x, rng)));
  }
  // Post-LN attention reads the rows as they are.
  Var content_attention(const Var& x, const Var& rows) const { return attn->content_attention(detach(x), rows); }
  Var forward(const Var& x_in, InferenceState& state) const {
    const Var x = ln_1->forward(add(x_in, attn->forward(x_in, state)));
    Rng unused(0);  // eval mode: no dropout draws
    return ln_2->forward(add(x, mlp->forward(x, unused)));
  }
};

}  // namespace

BlockKind post_ln_block_kind() {
  BlockKind kind;
  kind.name = "post_ln";
  kind.summary = "post-LN residual blocks x = ln_1(x + attn(x)); x = ln_2(x + mlp(x)) (Vaswani; canonical TrXL)";
  kind.make = [](const ModelConfig& cfg, const Positional& positional, Rng& rng) {
    return std::make_shared<SequentialStack<PostLNBlock>>(cfg, positional, rng);
  };
  kind.parameters = transformer_stack_parameters;
  kind.check = [](const ModelConfig&) {};
  kind.memory = true;
  return kind;
}

}  // namespace tapeformer
