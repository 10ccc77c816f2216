// Blocks: how the n_layer layers between the embeddings and the output head
// are wired, as one interface with kinds a config selects by name
// (`model.block`).
//
//   ModelConfig cfg;  cfg.block = "reversible";
//   auto pos = positional_kinds().get(cfg.positional).make(cfg, rng);
//   std::shared_ptr<BlockStack> stack = block_kinds().get(cfg.block).make(cfg, *pos, rng);
//   Var h = stack->forward(x, rng);                    // (B, T, C) -> (B, T, C), before ln_f
//
//   NoGradGuard no_grad;  stack->eval();
//   auto state = stack->make_state(/*batch=*/1, /*window=*/64);
//   h = stack->forward(x_prompt, *state);              // (1, t, C)
//   h = stack->forward(x_next, *state);                // (1, 1, C)
//
// A stack holds its layers as children "0", "1", ... (checkpoint keys
// "0.attn.qkv.weight", ...; TransformerLM registers the stack without a
// prefix), each with the config's attention kind and positional scheme
// inside. What the stack keeps for the backward is its own business: the
// standard stack keeps every layer's activations (the tape), the reversible
// one only its outputs, recomputing the rest in the backward.
//
// Kinds: the table in layers/block/registry.cpp, one file each beside it
// (`tapeformer kinds` and docs/kinds.md list them with their papers).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/autograd/rebuild.h"
#include "tapeformer/autograd/recompute.h"
#include "tapeformer/core/registry.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/layers/inference_state.h"
#include "tapeformer/layers/memory/memory.h"
#include "tapeformer/layers/model_config.h"
#include "tapeformer/layers/module.h"
#include "tapeformer/layers/positional/positional.h"

namespace tapeformer {

class BlockStack : public Module {
 public:
  // x (B, T, C), the embeddings of positions 0..T-1 -> (B, T, C), the input
  // of the final norm.
  virtual Var forward(const Var& x, Rng& rng) const = 0;
  // Reading a sequence piece by piece: one state per layer (KV cache,
  // running sums) in one InferenceState; window as Attention::make_state.
  virtual std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const = 0;
  // x (B, T, C) of the T positions after those the state has seen -> (B, T, C).
  virtual Var forward(const Var& x, InferenceState& state) const = 0;
  // A segment after those `memory` holds (Transformer-XL): each layer attends
  // to its memory rows and causally to x; memory then holds each layer's
  // inputs at the last mem_len positions. Stacks without memory refuse.
  virtual Var forward(const Var& x, SegmentMemory& memory, Rng& rng) const;

  // Activation recompute (autograd/recompute.h): layers 0, every, 2 every,
  // ... keep only their inputs and run their forward again in the backward
  // (0: none); the gradients are the same bits. Set on a whole model with
  // LanguageModel::set_recompute. A stack that recomputes by construction
  // (reversible) has nothing more to do.
  void set_recompute(int64_t every);
  int64_t recompute_every() const { return recompute_every_; }

 protected:
  // Whether layer i recomputes.
  bool recomputes(size_t layer) const {
    return recompute_every_ > 0 && static_cast<int64_t>(layer) % recompute_every_ == 0;
  }

 private:
  int64_t recompute_every_ = 0;
};

// layer->forward(x, rng), x (B, T, C) -> (B, T, C), its tensors recomputed in
// the backward (the layer is owned by the recompute until then). Its cheap
// outputs (LayerNorm's) are released in the second run too.
template <class Layer>
Var recomputed_forward(const std::shared_ptr<Layer>& layer, const Var& x, Rng& rng) {
  return recompute([layer](const std::vector<Var>& in, Rng& r) {
           return std::vector<Var>{release_rebuildable([&] { return layer->forward(in[0], r); })};
         }, {x}, rng)[0];
}

// The new memory of one layer: the last mem_len rows of [old; x], (B, <= mem_len, C),
// detached (Transformer-XL's _update_mems with ext_len = 0).
Tensor next_memory(const Tensor& old, const Var& x, int64_t mem_len);

struct BlockKind {
  std::string name;
  std::string summary;               // one line, for errors and docs
  std::vector<ModelOption> options;  // the model.* keys it reads (e.g. ff_chunks)
  std::function<std::shared_ptr<BlockStack>(const ModelConfig&, const Positional&, Rng&)> make;
  // Parameters of the whole stack: its layers (their attention and MLP) and
  // the memories it runs (memory_parameters); the positional scheme's are
  // its own kind's (PositionalKind::parameters), which the model adds.
  std::function<double(const ModelConfig&)> parameters;
  // Throws Error naming the keys when the config cannot use this kind.
  std::function<void(const ModelConfig&)> check;
  // Whether its stack carries memories across segments (layers/memory/memory.h):
  // the memory kinds' keys apply to it, and every kind a config turns on runs in it.
  bool memory = false;
};

// The table of block kinds (layers/block/registry.cpp). A program may add its
// own at start-up: block_kinds().add({...}).
Registry<BlockKind>& block_kinds();

// The state of a stack of layers that each carry their own (one per layer).
class LayerStates : public InferenceState {
 public:
  std::string name() const override { return "layer states"; }
  int64_t length() const override { return length_; }
  void reset() override {
    for (auto& s : layers) s->reset();
    length_ = 0;
  }
  void advance(int64_t T) { length_ += T; }
  std::vector<std::unique_ptr<InferenceState>> layers;

  // The states of `blocks` (anything with make_state(batch, window)), in order.
  template <class Blocks>
  static std::unique_ptr<LayerStates> of(const Blocks& blocks, int64_t batch, int64_t window) {
    auto state = std::make_unique<LayerStates>();
    for (const auto& block : blocks) state->layers.push_back(block->make_state(batch, window));
    return state;
  }
  // `state` as the LayerStates of a stack of `count` layers; Error otherwise.
  static LayerStates& of_stack(InferenceState& state, size_t count) {
    LayerStates& s = state_as<LayerStates>(state, "block stack", "layer states");
    TAPEFORMER_CHECK(s.layers.size() == count, "block stack: a state of ", s.layers.size(),
                     " layers for a stack of ", count);
    return s;
  }

 private:
  int64_t length_ = 0;
};

}  // namespace tapeformer
