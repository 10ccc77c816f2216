// The Memorizing Transformer's external memory (Wu et al. 2022), the memory
// kind "memorizing" (model.xmem_len > 0): one layer (model.xmem_layer, by
// default the one below the top) also attends to the top model.xmem_topk
// (key, value) pairs of model.xmem_len past positions, a memory without
// gradient (external_memory.h; group "external": keys and values, (B, N, C)
// each), mixed with its local attention by a learned gate per head:
//
//   y_h = g_h y_mem + (1 - g_h) y_local,   g_h = sigmoid(b_h)     (before the output projection)
//
// The memory wraps that layer's attention (any ProjectedAttention that gives
// its heads, attend_with_heads) in a MemorizingAttention, which keeps the
// wrapped one's checkpoint keys and adds "xmem_gate" (b, starting at
// model.xmem_gate_bias) and "xmem_scale" (the log temperatures s of the
// retrieved pairs' cosine scores, starting at log 10). Within a segment the
// queries read the memory first; then the segment's keys and values are
// appended, so a segment never retrieves itself.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/layers/attention/projected.h"
#include "tapeformer/layers/memory/external_memory.h"
#include "tapeformer/layers/model_config.h"

namespace tapeformer {

// Which layer of a stack keeps an external memory (model.xmem_*).
struct Memorizing {
  int64_t len = 0;       // model.xmem_len: positions the memory keeps (0: off)
  int64_t layer = -1;    // model.xmem_layer: the layer that reads it (-1: the one below the top)
  int64_t top_k = 32;    // model.xmem_topk: pairs retrieved per query
  double gate_bias = 0;  // model.xmem_gate_bias: the gate's b at initialisation, g = sigmoid(b)
  static Memorizing of(const ModelConfig& cfg);  // off when the block kind carries no memories; layer resolved
};

// A layer's attention with the external memory read inside it.
class MemorizingAttention : public Attention {
 public:
  // gate_bias: each head's b at initialisation.
  MemorizingAttention(std::shared_ptr<ProjectedAttention> inner, float gate_bias);

  // Without a memory lent: the wrapped attention's own forwards.
  Var forward(const Var& x, Rng& rng) const override { return inner_->forward(x, rng); }
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const override {
    return inner_->make_state(batch, window);
  }
  Var forward(const Var& x, InferenceState& state) const override { return inner_->forward(x, state); }
  Var content_attention(const Var& x, const Var& rows) const override { return inner_->content_attention(x, rows); }
  // x (B, T, C) over its segment memory rows (B, M, C), and the external
  // memory lent for the call: its retrieval mixed into the local attention,
  // then the segment's keys and values appended -> (B, T, C).
  Var forward(const Var& x, const Var& memory, Rng& rng) const override;

  // The memory the next forward(x, memory, rng) calls read and append to (null: none).
  void lend(ExternalMemory* memory) const { external_ = memory; }
  const ProjectedAttention& inner() const { return *inner_; }

  Var xmem_gate;   // (H) the gate's logits b
  Var xmem_scale;  // (H) log temperatures s of the memory's cosine scores
  static constexpr double kXmemScale = 10.0;  // tau = exp(s) at initialisation: a cosine gap of 0.1 is e^1

 protected:
  // "xmem_gate", g_h = sigmoid(b_h), and "xmem_scale", tau_h, per head, logged on evaluation steps.
  std::vector<std::pair<std::string, std::vector<double>>> own_metrics() const override;

 private:
  std::shared_ptr<ProjectedAttention> inner_;  // registered inline: its keys stay the layer's ("attn.qkv.weight")
  mutable ExternalMemory* external_ = nullptr;
};

}  // namespace tapeformer
