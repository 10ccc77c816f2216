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
// Kinds: "standard" (pre-LN residual blocks, nanoGPT's; layers/block/standard.h),
// "reversible" (RevNet couplings, Gomez et al. 2017; layers/block/reversible.h),
// "post_ln" (the original Transformer's post-LN blocks; layers/block/post_ln.cpp),
// "gtrxl" (identity-map reordering with gates, Parisotto et al. 2020; layers/block/gtrxl.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/core/registry.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/layers/inference_state.h"
#include "tapeformer/layers/memory/memory.h"
#include "tapeformer/layers/model_config.h"
#include "tapeformer/layers/module.h"
#include "tapeformer/layers/positional/positional.h"

namespace tapeformer {

// The groups a stack of `cfg` keeps in its segment memory, in checkpoint
// order; none without model.mem_len.
std::vector<MemoryGroupSpec> memory_groups(const ModelConfig& cfg);

// How a stack compresses what falls out of its memory (model.cmem_*).
struct MemoryCompression {
  int64_t len = 0;          // model.cmem_len: compressed rows kept per layer (0: off, rows are dropped)
  int64_t ratio = 2;        // model.cmem_ratio, c: memory rows per compressed row
  std::string fn = "mean";  // model.cmem_fn: "mean" or "max" over each c consecutive rows, or "conv" (learned)
  bool learned() const { return len > 0 && fn == "conv"; }
  static MemoryCompression of(const ModelConfig& cfg);  // off for a block kind without the keys
};

// Which layer of a stack keeps an external memory (model.xmem_*; the
// Memorizing Transformer, layers/attention/external_memory.h).
struct Memorizing {
  int64_t len = 0;     // model.xmem_len: positions the memory keeps (0: off)
  int64_t layer = -1;  // model.xmem_layer: the layer that reads it (-1: the one below the top)
  int64_t top_k = 32;  // model.xmem_topk: pairs retrieved per query
  double gate_bias = 0;  // model.xmem_gate_bias: the gate's b at initialisation, g = sigmoid(b)
  static Memorizing of(const ModelConfig& cfg);  // off for a block kind without the keys; layer resolved
};

// rows (B, n, C) -> (B, n / c, C): each c consecutive rows pooled ("mean" or
// "max"), oldest first; the n mod c oldest rows are dropped.
Tensor compress_rows(const Tensor& rows, const MemoryCompression& c);

// The learned compression (model.cmem_fn "conv"): per layer, a 1-D
// convolution over time with kernel = stride = c, C channels in and out.
// For the k-th group of c rows r_{kc}, ..., r_{kc+c-1} (each (C)):
//
//   y_k = b + sum_{i<c} r_{kc+i} W_i         W_i [C, C], b [C]
//
// computed as one matrix product of the groups laid side by side,
// (B, n/c, cC) x W [cC, C]. It starts as the mean (W_i = I / c, b = 0), so
// an untrained model compresses as "mean" does. Keys "compress.L.weight",
// "compress.L.bias" for layer L.
class ConvCompression : public Module {
 public:
  ConvCompression(int64_t n_layer, int64_t n_embd, int64_t ratio);
  // Layer `layer`'s compression of rows (B, n, C), n a multiple of c -> (B, n / c, C).
  Var forward(size_t layer, const Var& rows) const;
  // Parameters of a stack of `cfg` (0 unless model.cmem_fn is "conv").
  static double parameters(const ModelConfig& cfg);
  // The attention-reconstruction loss of the segment just read (training;
  // undefined otherwise): an auxiliary loss of the batch, which the trainer
  // backpropagates beside the LM loss (Module::auxiliary_loss). Its gradient
  // reaches the compression alone, and the LM loss none of it.
  void set_reconstruction_loss(Var loss) const { reconstruction_ = std::move(loss); }
  int64_t ratio;
  std::vector<Var> weights, biases;  // [cC, C] and [C] per layer

 protected:
  Var own_auxiliary_loss(bool of_batch) const override { return of_batch ? reconstruction_ : Var(); }

 private:
  mutable Var reconstruction_;
};

// The Compressive Transformer's attention-reconstruction loss of one layer
// (Rae et al. 2019 §3.2): how far attention over the compressed rows is from
// attention over the rows they replace, for the queries of the segment:
//
//   L = mean( (attn(h, old) - attn(h, f(old)))^2 )
//
// attend(rows) is the layer's content attention of h over rows (B, n, C) ->
// (B, T, C) with the layer's weights held fixed; old (B, n, C) are the rows
// that fell out of the memory, compressed (B, n / c, C) = f(old).
Var reconstruction_loss(const std::function<Var(const Var&)>& attend, const Tensor& old, const Var& compressed);

// What a layer attends to before its segment: [compressed; memory] (B, CM + M, C).
Tensor attended_memory(const Tensor& memory, const Tensor& compressed);

// memory becomes the last mem_len rows of [memory; x] (x (B, T, C), taken
// without gradient); returns the rows that fell out, oldest first (B, F, C),
// undefined when none did.
Tensor evict_rows(Tensor& memory, const Var& x, int64_t mem_len);

// compressed becomes the last len rows of [compressed; rows] (rows (B, n, C)).
void append_compressed(Tensor& compressed, const Tensor& rows, int64_t len);

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
};

// The new memory of one layer: the last mem_len rows of [old; x], (B, <= mem_len, C),
// detached (Transformer-XL's _update_mems with ext_len = 0).
Tensor next_memory(const Tensor& old, const Var& x, int64_t mem_len);

struct BlockKind {
  std::string name;
  std::string summary;               // one line, for errors and docs
  std::vector<ModelOption> options;  // the model.* keys it reads (e.g. ff_chunks)
  std::function<std::shared_ptr<BlockStack>(const ModelConfig&, const Positional&, Rng&)> make;
  // Parameters of the whole stack (attention and positional parts included).
  std::function<double(const ModelConfig&)> parameters;
  // Floats the stack keeps for the backward of one sequence of T tokens (a
  // lower bound; see AttentionKind::activation_floats).
  std::function<double(const ModelConfig&, int64_t T)> activation_floats;
  // Throws Error naming the keys when the config cannot use this kind.
  std::function<void(const ModelConfig&)> check;
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
