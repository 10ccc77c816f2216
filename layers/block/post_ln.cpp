// The post-LN stack of the original Transformer and the canonical
// Transformer-XL (the baseline GTrXL's experiments start from):
//
//   x = ln_1(x + attn(x));  x = ln_2(x + mlp(x))       (B, T, C)
//
// The same layers (and checkpoint keys) as the standard stack; only the
// place of the norms differs, so no identity path runs from the embeddings
// to the output.
#include <string>

#include "core/error.h"
#include "layers/block/standard.h"

namespace tapeformer {
namespace {

class PostLNStack : public BlockStack {
 public:
  PostLNStack(const ModelConfig& cfg, const Positional& positional, Rng& rng) : mem_len(cfg.option_int("mem_len")) {
    for (int64_t i = 0; i < cfg.n_layer; ++i)
      blocks.push_back(register_module(std::to_string(i), std::make_shared<TransformerBlock>(cfg, positional, rng)));
  }

  Var forward(const Var& x_in, Rng& rng) const override {
    Var x = x_in;
    for (const auto& b : blocks) {
      x = b->ln_1->forward(add(x, b->attn->forward(x, rng)));
      x = b->ln_2->forward(add(x, b->mlp->forward(x, rng)));
    }
    return x;
  }

  Var forward(const Var& x_in, SegmentMemory& memory, Rng& rng) const override {
    TAPEFORMER_CHECK(mem_len > 0, "PostLNStack: a segment memory needs model.mem_len > 0");
    memory.layers.resize(blocks.size());
    Var x = x_in;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const TransformerBlock& b = *blocks[i];
      const Var in = x;
      const Tensor& mem = memory.layers[i];
      x = b.ln_1->forward(add(x, mem.defined() ? b.attn->forward(x, Var(mem), rng) : b.attn->forward(x, rng)));
      x = b.ln_2->forward(add(x, b.mlp->forward(x, rng)));
      memory.layers[i] = next_memory(mem, in, memory.limit > 0 ? memory.limit : mem_len);
    }
    return x;
  }

  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const override {
    auto state = std::make_unique<LayerStates>();
    for (const auto& b : blocks) state->layers.push_back(b->make_state(batch, window));
    return state;
  }

  Var forward(const Var& x_in, InferenceState& state) const override {
    LayerStates& s = state_as<LayerStates>(state, "PostLNStack", "layer states");
    TAPEFORMER_CHECK(s.layers.size() == blocks.size(), "PostLNStack: a state of ", s.layers.size(),
                     " layers for a stack of ", blocks.size());
    Rng unused(0);  // eval mode: no dropout draws
    Var x = x_in;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const TransformerBlock& b = *blocks[i];
      x = b.ln_1->forward(add(x, b.attn->forward(x, *s.layers[i])));
      x = b.ln_2->forward(add(x, b.mlp->forward(x, unused)));
    }
    s.advance(x_in.dim(1));
    return x;
  }

  std::vector<std::shared_ptr<TransformerBlock>> blocks;
  int64_t mem_len = 0;
};

}  // namespace

BlockKind post_ln_block_kind() {
  BlockKind kind;
  kind.name = "post_ln";
  kind.summary = "post-LN residual blocks x = ln_1(x + attn(x)); x = ln_2(x + mlp(x)) (Vaswani; canonical TrXL)";
  kind.options = {mem_len_option()};
  kind.make = [](const ModelConfig& cfg, const Positional& positional, Rng& rng) {
    return std::make_shared<PostLNStack>(cfg, positional, rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    return static_cast<double>(cfg.n_layer) * transformer_block_parameters(cfg);
  };
  kind.activation_floats = [](const ModelConfig& cfg, int64_t T) {
    return static_cast<double>(cfg.n_layer) * transformer_block_activation_floats(cfg, T);
  };
  kind.check = check_mem_len;
  return kind;
}

}  // namespace tapeformer
