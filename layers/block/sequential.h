// SequentialStack<Layer>: n_layer layers run one after the other, each with
// its own inference state and its own slice of a segment memory. The
// standard, post-LN and gated stacks are this template over their layer.
//
//   using StandardStack = SequentialStack<TransformerBlock>;
//
// A Layer provides Layer(cfg, positional, rng); forward(x, rng);
// forward(x, memory, rng) with its inputs at earlier positions (B, M, C);
// make_state(batch, window); forward(x, state); and, for the learned memory
// compression (model.cmem_fn "conv") only, content_attention(x, rows), its
// reconstruction target. Layers are registered as "0", "1", ... (checkpoint
// keys "0.attn.qkv.weight", ...), the learned compression, if any, as
// "compress".
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/block/block.h"

namespace tapeformer {

namespace detail {
template <class Layer, class = void>
struct HasContentAttention : std::false_type {};
template <class Layer>
struct HasContentAttention<Layer, std::void_t<decltype(std::declval<const Layer&>().content_attention(
                                      std::declval<const Var&>(), std::declval<const Var&>()))>> : std::true_type {};
template <class Layer, class = void>
struct HasAttention : std::false_type {};
template <class Layer>
struct HasAttention<Layer, std::void_t<decltype(std::declval<Layer&>().attn->enable_memorizing(0.0f))>> : std::true_type {};
}  // namespace detail

template <class Layer>
class SequentialStack : public BlockStack {
 public:
  SequentialStack(const ModelConfig& cfg, const Positional& positional, Rng& rng)
      : mem_len(cfg.option_int("mem_len")), ext_len(cfg.option_int("ext_len")),
        compression(MemoryCompression::of(cfg)), memorizing(Memorizing::of(cfg)) {
    for (int64_t i = 0; i < cfg.n_layer; ++i)
      blocks.push_back(register_module(std::to_string(i), std::make_shared<Layer>(cfg, positional, rng)));
    if (compression.learned())
      conv = register_module("compress", std::make_shared<ConvCompression>(cfg.n_layer, cfg.n_embd, compression.ratio));
    if (memorizing.len > 0) {
      if constexpr (detail::HasAttention<Layer>::value) {
        blocks[static_cast<size_t>(memorizing.layer)]->attn->enable_memorizing(static_cast<float>(memorizing.gate_bias));
      } else {
        fail("block stack: model.xmem_len needs layers with an attention member `attn`, which this stack's layer "
             "lacks");
      }
    }
  }

  Var forward(const Var& x_in, Rng& rng) const override {
    Var x = x_in;
    for (const auto& block : blocks) x = block->forward(x, rng);
    return x;
  }

  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const override {
    return LayerStates::of(blocks, batch, window);
  }

  Var forward(const Var& x_in, InferenceState& state) const override {
    LayerStates& s = LayerStates::of_stack(state, blocks.size());
    Var x = x_in;
    for (size_t i = 0; i < blocks.size(); ++i) x = blocks[i]->forward(x, *s.layers[i]);
    s.advance(x_in.dim(1));
    return x;
  }

  Var forward(const Var& x_in, SegmentMemory& memory, Rng& rng) const override {
    TAPEFORMER_CHECK(mem_len > 0, "block stack: a segment memory needs model.mem_len > 0");
    const bool compress = compression.len > 0;
    // Every group first, then references: adding a group may move the others.
    memory.group("layers");
    if (compress) memory.group("compressed");
    if (memorizing.len > 0) memory.group("external");
    std::vector<Tensor>& layers = memory.group("layers");
    layers.resize(blocks.size());
    std::vector<Tensor>* compressed = compress ? &memory.group("compressed") : nullptr;
    if (compress) compressed->resize(blocks.size());
    Var reconstruction;  // the learned compression's loss of this segment (training)
    const bool reconstruct = conv && is_training() && grad_enabled();
    const int64_t limit = memory.limit > 0 ? memory.limit : mem_len;
    std::vector<Tensor>* external = memorizing.len > 0 ? &memory.group("external") : nullptr;
    if (external) external->resize(2);
    Var x = x_in;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const Var in = x;
      const Tensor rows = compress ? attended_memory(layers[i], (*compressed)[i]) : layers[i];
      if (external && static_cast<int64_t>(i) == memorizing.layer) {
        x = forward_memorizing(*blocks[i], in, rows, *external, rng);
      } else {
        x = blocks[i]->forward(in, rows, rng);
      }
      // The last ext_len positions come again at the start of the next input.
      const int64_t keep = std::max<int64_t>(0, in.dim(1) - ext_len);
      if (keep == 0) continue;
      if (!compress) {
        layers[i] = next_memory(layers[i], slice(in, 1, 0, keep), limit);
        continue;
      }
      const Tensor old = evict_rows(layers[i], slice(in, 1, 0, keep), limit);  // (B, F, C)
      if (!old.defined()) continue;
      if (!conv) {
        append_compressed((*compressed)[i], compress_rows(old, compression), compression.len);
        continue;
      }
      // Whole groups of c rows only; an evaluation memory of another length may leave the oldest few over.
      const int64_t F = old.dim(1), whole = F - F % compression.ratio;
      if (whole == 0) continue;
      const Tensor groups = old.slice(1, F - whole, F).contiguous();  // (B, whole, C)
      const Var pooled = conv->forward(i, Var(groups));              // (B, whole / c, C)
      if (reconstruct) {
        const Layer& layer = *blocks[i];
        const auto attend = [&](const Var& rows) -> Var {
          if constexpr (detail::HasContentAttention<Layer>::value) {
            return layer.content_attention(in, rows);
          } else {
            fail("block stack: model.cmem_fn \"conv\" needs layers with content_attention(x, rows), which this "
                 "stack's layer lacks");
          }
        };
        const Var loss = reconstruction_loss(attend, groups, pooled);
        reconstruction = reconstruction.defined() ? add(reconstruction, loss) : loss;
      }
      append_compressed((*compressed)[i], pooled.value(), compression.len);
    }
    if (conv) conv->set_reconstruction_loss(reconstruction);  // the trainer's auxiliary loss (training), else none
    return x;
  }

  // The memorizing layer's forward, its attention lent the external memory for the call.
  Var forward_memorizing(const Layer& layer, const Var& x, const Tensor& rows, std::vector<Tensor>& keys_values,
                         Rng& rng) const {
    if constexpr (detail::HasAttention<Layer>::value) {
      ExternalMemory external{&keys_values[0], &keys_values[1], memorizing.len, memorizing.top_k};
      struct Lend {
        const Attention& attn;
        ~Lend() { attn.lend_external_memory(nullptr); }
      } lend{*layer.attn};
      layer.attn->lend_external_memory(&external);
      return layer.forward(x, rows, rng);
    } else {
      fail("block stack: model.xmem_len needs layers with an attention member `attn`");
    }
  }

  std::vector<std::shared_ptr<Layer>> blocks;  // registered as "0", "1", ...
  int64_t mem_len = 0;                         // model.mem_len
  int64_t ext_len = 0;                         // model.ext_len
  MemoryCompression compression;               // model.cmem_* (Compressive Transformer)
  std::shared_ptr<ConvCompression> conv;       // model.cmem_fn "conv": the learned compression; null otherwise
  Memorizing memorizing;                       // model.xmem_* (Memorizing Transformer)
};

}  // namespace tapeformer
