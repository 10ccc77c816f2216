#include "tapeformer/layers/memory/memorizing.h"

#include <algorithm>
#include <cmath>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/memory/memory.h"

namespace tapeformer {

Memorizing Memorizing::of(const ModelConfig& cfg) {
  Memorizing m;
  if (block_kinds().get(cfg.block).memory)
    m = {cfg.option_int("xmem_len"), cfg.option_int("xmem_layer"), cfg.option_int("xmem_topk"),
         cfg.option_number("xmem_gate_bias")};
  if (m.layer < 0) m.layer = std::max<int64_t>(0, cfg.n_layer - 2);
  return m;
}

MemorizingAttention::MemorizingAttention(std::shared_ptr<ProjectedAttention> inner, float gate_bias)
    : Attention(inner ? inner->positional_layer() : nullptr, Wraps{}),
      inner_(std::move(inner)) {
  const int64_t H = inner_->n_head;
  xmem_gate = register_parameter("xmem_gate", Tensor::full({H}, gate_bias));
  xmem_scale = register_parameter("xmem_scale", Tensor::full({H}, static_cast<float>(std::log(kXmemScale))));
  register_inline(inner_);
}

Var MemorizingAttention::forward(const Var& x, const Var& memory, Rng& rng) const {
  if (external_ == nullptr) return inner_->forward(x, memory, rng);
  const ProjectedAttention::Attended a = inner_->attend_with_heads(x, memory, rng);  // y (B, T, C)
  const std::vector<Var> h = inner_->heads_of(a.projected);                       // q, k, v (B, H, T, D)
  Var y = a.y;
  if (external_->length() > 0) {
    const int64_t H = inner_->n_head, D = inner_->n_embd / H;
    const Var y_mem = merge_heads(retrieved_attention(h[0], *external_, xmem_scale));    // (B, T, C)
    const Var g = reshape(expand(reshape(sigmoid(xmem_gate), {H, 1}), {H, D}), {H * D});  // g_h per column
    y = add(mul(y_mem, g), mul(y, add_scalar(neg(g), 1.0f)));
  }
  external_->append(h[1].value(), h[2].value());  // after the queries: a segment never retrieves itself
  return inner_->project(y, rng);
}

std::vector<std::pair<std::string, std::vector<double>>> MemorizingAttention::own_metrics() const {
  std::vector<double> g, tau;
  for (int64_t h = 0; h < inner_->n_head; ++h) {
    g.push_back(1.0 / (1.0 + std::exp(-static_cast<double>(xmem_gate.value().data()[h]))));
    tau.push_back(std::exp(static_cast<double>(xmem_scale.value().data()[h])));
  }
  return {{"xmem_gate", g}, {"xmem_scale", tau}};
}

namespace {

constexpr const char* kGroup = "external";

class MemorizingMemory : public Memory {
 public:
  MemorizingMemory(const Memorizing& m, const MemoryHost& host) : m_(m) {
    const std::shared_ptr<Attention> attn = host.attention ? host.attention(static_cast<size_t>(m.layer)) : nullptr;
    TAPEFORMER_CHECK(attn != nullptr && host.wrap_attention, "model.xmem_len needs a block kind whose layers have an "
                     "attention to wrap");
    auto projected = std::dynamic_pointer_cast<ProjectedAttention>(attn);
    TAPEFORMER_CHECK(projected != nullptr, "model.xmem_len needs an attention kind with qkv projections "
                     "(ProjectedAttention), such as model.attention \"softmax\"");
    wrapper_ = std::make_shared<MemorizingAttention>(projected, static_cast<float>(m.gate_bias));
    host.wrap_attention(static_cast<size_t>(m.layer), wrapper_);
  }

  void begin_segment(SegmentMemory& state, size_t) const override { state.group(kGroup).resize(2); }
  bool lends(size_t layer) const override { return static_cast<int64_t>(layer) == m_.layer; }
  Var around(SegmentMemory& state, size_t layer, const std::function<Var()>& run) const override {
    if (static_cast<int64_t>(layer) != m_.layer) return run();
    std::vector<Tensor>& keys_values = state.group(kGroup);
    ExternalMemory external{&keys_values[0], &keys_values[1], m_.len, m_.top_k};
    struct Lend {
      const MemorizingAttention& attn;
      ~Lend() { attn.lend(nullptr); }
    } lend{*wrapper_};
    wrapper_->lend(&external);
    return run();
  }

 private:
  Memorizing m_;
  std::shared_ptr<MemorizingAttention> wrapper_;  // registered by the layer, in its attention's place
};

}  // namespace

MemoryKind memorizing_memory_kind() {
  MemoryKind kind;
  kind.name = "memorizing";
  kind.summary = "the Memorizing Transformer's external memory (Wu et al. 2022): one layer also attends to the top "
                 "model.xmem_topk of model.xmem_len past keys and values, mixed in by a learned gate per head";
  kind.options = {
      {"xmem_len", int64_t{0},
       "Memorizing Transformer: one layer also attends to the top model.xmem_topk of the keys and values of this "
       "many past positions, an external memory without gradient, through a learned gate per head (0: off)",
       OptionValue{int64_t{64}}},
      {"xmem_layer", int64_t{-1}, "Memorizing Transformer: the layer with the external memory (-1: the one below the "
                                  "top)"},
      {"xmem_topk", int64_t{32}, "Memorizing Transformer: (key, value) pairs retrieved per query",
       OptionValue{int64_t{4}}},
      {"xmem_gate_bias", 0.0,
       "Memorizing Transformer: each head's gate bias b at initialisation, g = sigmoid(b) the share of the memory's "
       "attention (0: half; below 0: local attention first)"}};
  kind.needs = {"xl"};
  kind.make = [](const ModelConfig& cfg, const MemoryHost& host) -> std::shared_ptr<Memory> {
    return std::make_shared<MemorizingMemory>(Memorizing::of(cfg), host);
  };
  kind.use = [](const ModelConfig& cfg, bool on, MemoryUse& use) {
    if (on) use.groups.push_back({kGroup, 2, cfg.option_int("xmem_len"), cfg.n_embd, "external memory", 2});
  };
  kind.parameters = [](const ModelConfig& cfg) {
    return Memorizing::of(cfg).len > 0 ? 2.0 * static_cast<double>(cfg.n_head) : 0.0;  // xmem_gate, xmem_scale
  };
  kind.check = [](const ModelConfig& cfg) {
    const int64_t m = cfg.option_int("mem_len");
    const Memorizing x = Memorizing::of(cfg);
    TAPEFORMER_CHECK(x.len >= 0 && x.len <= 1 << 20, "model.xmem_len must be in [0, 2^20], got ", x.len);
    if (x.len == 0) {
      TAPEFORMER_CHECK(cfg.option_int("xmem_layer") == -1 && x.top_k == 32 && x.gate_bias == 0,
                       "model.xmem_layer, model.xmem_topk and model.xmem_gate_bias apply only with an external "
                       "memory: set model.xmem_len > 0, or leave them at their defaults");
      return;
    }
    TAPEFORMER_CHECK(m > 0, "model.xmem_len = ", x.len, " is carried across segments like the memory: set "
                     "model.mem_len > 0");
    TAPEFORMER_CHECK(x.layer < cfg.n_layer && cfg.option_int("xmem_layer") >= -1, "model.xmem_layer must be in [-1, ",
                     cfg.n_layer - 1, "] (model.n_layer = ", cfg.n_layer, "), got ", cfg.option_int("xmem_layer"));
    TAPEFORMER_CHECK(std::isfinite(x.gate_bias) && std::fabs(x.gate_bias) <= 30,
                     "model.xmem_gate_bias must be a number in [-30, 30], got ", x.gate_bias);
    TAPEFORMER_CHECK(x.top_k >= 1 && x.top_k <= x.len, "model.xmem_topk must be in [1, model.xmem_len = ", x.len,
                     "], got ", x.top_k);
  };
  return kind;
}

}  // namespace tapeformer
