// SequentialStack<Layer>: n_layer layers run one after the other, each with
// its own inference state and the memories a config turns on
// (layers/memory/memory.h). The standard, post-LN and gated stacks are this
// template over their layer.
//
//   using StandardStack = SequentialStack<TransformerBlock>;
//
// A Layer provides Layer(cfg, positional, rng); forward(x, rng);
// forward(x, memory, rng) with what it attends to before the segment
// (B, M, C); make_state(batch, window); forward(x, state); and, for the
// memories that need them, content_attention(x, rows) (a learned
// compression's reconstruction target) and an attention member `attn` (the
// external memory wraps one layer's). Layers are registered as "0", "1", ...
// (checkpoint keys "0.attn.qkv.weight", ...), the memories after them inline
// (a learned compression's keys are "compress.*").
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
#include "tapeformer/layers/memory/memory.h"

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
struct HasAttention<Layer, std::void_t<decltype(std::declval<Layer&>().attn = std::shared_ptr<Attention>())>>
    : std::true_type {};
}  // namespace detail

template <class Layer>
class SequentialStack : public BlockStack {
 public:
  SequentialStack(const ModelConfig& cfg, const Positional& positional, Rng& rng) : use_(memory_use(cfg)) {
    for (int64_t i = 0; i < cfg.n_layer; ++i)
      blocks.push_back(register_module(std::to_string(i), std::make_shared<Layer>(cfg, positional, rng)));
    MemoryHost host;
    host.layers = cfg.n_layer;
    if constexpr (detail::HasAttention<Layer>::value) {
      host.attention = [this](size_t i) { return blocks[i]->attn; };
      host.wrap_attention = [this](size_t i, std::shared_ptr<Attention> wrapper) {
        blocks[i]->replace_module("attn", wrapper);
        blocks[i]->attn = std::move(wrapper);
      };
    }
    for (const MemoryKind* kind : memories_on(cfg)) {
      // What the kind adds to the stack (its own modules, or what it wraps into
      // the layers) must be what its entry counts, or the model's count is wrong.
      const int64_t before = num_parameters();
      memories.push_back(register_inline(kind->make(cfg, host)));
      const double added = static_cast<double>(num_parameters() - before),
                   counted = kind->parameters ? kind->parameters(cfg) : 0.0;
      TAPEFORMER_CHECK(added == counted, "memory \"", kind->name, "\": its entry counts ", counted,
                       " parameters (MemoryKind::parameters) but it adds ", added, " to a stack of model.n_layer = ",
                       cfg.n_layer, ", model.n_embd = ", cfg.n_embd);
    }
  }

  Var forward(const Var& x_in, Rng& rng) const override {
    Var x = x_in;
    for (size_t i = 0; i < blocks.size(); ++i) x = layer_forward(i, x, rng);
    return x;
  }
  // Layer i alone, x (B, T, C) -> (B, T, C), recomputed in the backward when
  // the stack's setting says so (a model that runs the layers itself: early
  // exit). Either way its LayerNorm outputs are not kept past it, but
  // rebuilt where the backward reads them (autograd/rebuild.h).
  Var layer_forward(size_t i, const Var& x, Rng& rng) const {
    if (recomputes(i)) return recomputed_forward(blocks[i], x, rng);
    return release_rebuildable([&] { return blocks[i]->forward(x, rng); });
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

  Var forward(const Var& x_in, SegmentMemory& state, Rng& rng) const override {
    TAPEFORMER_CHECK(use_.carried(), "block stack: a segment memory needs model.mem_len > 0");
    for (const auto& m : memories) m->begin_segment(state, blocks.size());
    bool evicted_wanted = false;
    for (const auto& m : memories) evicted_wanted = evicted_wanted || m->wants_evicted();
    Var x = x_in;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const Var in = x;
      const Layer& layer = *blocks[i];
      Tensor rows;  // what layer i attends to before its segment
      for (const auto& m : memories) rows = m->attended(state, i, rows);
      // Each memory around the layer's forward, the first outermost. The
      // memory rows are an input of a recomputed layer, not state it keeps;
      // a layer a memory lends something to for the call is not recomputed.
      bool lent = false;
      for (const auto& m : memories) lent = lent || m->lends(i);
      std::function<Var()> run = [&] {
        if (!recomputes(i) || lent) return release_rebuildable([&] { return layer.forward(in, rows, rng); });
        return recompute([block = blocks[i], rows](const std::vector<Var>& x, Rng& r) {
                 return std::vector<Var>{release_rebuildable([&] { return block->forward(x[0], rows, r); })};
               }, {in}, rng)[0];
      };
      for (auto m = memories.rbegin(); m != memories.rend(); ++m)
        run = [&state, i, inner = std::move(run), mem = m->get()] { return mem->around(state, i, inner); };
      x = run();
      // The last ext_len positions come again at the start of the next input.
      const int64_t keep = std::max<int64_t>(0, in.dim(1) - use_.ext_len);
      if (keep == 0) continue;
      MemoryLayer served;
      served.index = i;
      served.input = in;
      if constexpr (detail::HasContentAttention<Layer>::value)
        served.content_attention = [&layer, &in](const Var& r) { return layer.content_attention(in, r); };
      MemoryCarry carry;
      carry.wanted = evicted_wanted;
      for (const auto& m : memories) m->update(state, served, keep, carry);
    }
    return x;
  }

  std::vector<std::shared_ptr<Layer>> blocks;     // registered as "0", "1", ...
  std::vector<std::shared_ptr<Memory>> memories;  // the kinds the config turns on, in the table's order

 private:
  MemoryUse use_;  // mem_len, ext_len
};

}  // namespace tapeformer
