#include "tapeformer/layers/block/standard.h"

#include <cmath>
#include <string>

#include "tapeformer/core/error.h"

namespace tapeformer {

TransformerBlock::TransformerBlock(const ModelConfig& cfg, const Positional& positional, Rng& rng) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  std::shared_ptr<PositionalLayer> pos = positional.make_layer(rng);
  attn = register_module("attn", attention_kinds().get(cfg.attention).make(cfg, std::move(pos), rng));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  mlp = register_module("mlp", make_mlp(cfg, rng));
}

Var attend_normalised(const Attention& attn, const LayerNorm& ln, const Var& x, const Tensor& memory, Rng& rng) {
  // An empty memory goes through the memory forward too: an external memory lent to attn is read there.
  if (!memory.defined() || memory.dim(1) == 0) return attn.forward(ln.forward(x), Var(), rng);
  return attn.forward(ln.forward(x), ln.forward(Var(memory)), rng);
}

Var TransformerBlock::forward(const Var& x_in, Rng& rng) const { return forward(x_in, Tensor(), rng); }

Var TransformerBlock::forward(const Var& x_in, const Tensor& memory, Rng& rng) const {
  const Var x = add(x_in, attention_branch(x_in, memory, rng));
  return add(x, ff_branch(x, rng));
}

std::unique_ptr<InferenceState> TransformerBlock::make_state(int64_t batch, int64_t window) const {
  return attn->make_state(batch, window);
}

Var TransformerBlock::forward(const Var& x_in, InferenceState& state) const {
  const Var x = add(x_in, attention_branch(x_in, state));
  Rng unused(0);  // eval mode: no dropout draws
  return add(x, ff_branch(x, unused));
}

double transformer_block_parameters(const ModelConfig& cfg) {
  const double C = static_cast<double>(cfg.n_embd), b = cfg.bias ? 1 : 0;
  const double norm = C + b * C;                   // a LayerNorm's gain and bias
  return 2 * norm + attention_kinds().get(cfg.attention).parameters(cfg) + mlp_kinds().get(cfg.mlp).parameters(cfg);
}

double transformer_block_activation_floats(const ModelConfig& cfg, int64_t T) {
  return 4.0 * static_cast<double>(T) * static_cast<double>(cfg.n_embd) +
         attention_kinds().get(cfg.attention).activation_floats(cfg, T) +
         mlp_kinds().get(cfg.mlp).activation_floats(cfg, T);
}

double transformer_stack_parameters(const ModelConfig& cfg) {
  return static_cast<double>(cfg.n_layer) * transformer_block_parameters(cfg) + ConvCompression::parameters(cfg);
}

double transformer_stack_activation_floats(const ModelConfig& cfg, int64_t T) {
  return static_cast<double>(cfg.n_layer) * transformer_block_activation_floats(cfg, T);
}

std::vector<ModelOption> memory_options() {
  return {{"mem_len", int64_t{0},
           "Transformer-XL memory: each layer also attends to its inputs at this many earlier positions, carried "
           "across training steps (0: off)"},
          {"ext_len", int64_t{0},
           "Transformer-XL: this many tokens before each segment are fed again with it (their loss not counted) and "
           "kept out of the memory (docs/math.md#ext_len-and-evaluation; 0: off)"},
          {"cmem_len", int64_t{0},
           "Compressive Transformer: compressed rows per layer; the rows that fall out of the memory are pooled "
           "model.cmem_ratio to one into it instead of dropped, and attention reads [compressed; memory; segment] "
           "(0: off)"},
          {"cmem_ratio", int64_t{2}, "Compressive Transformer: c, memory rows per compressed row"},
          {"cmem_fn", std::string("mean"),
           "Compressive Transformer: the compression, \"mean\" or \"max\" over c rows, or \"conv\": a learned 1-D "
           "convolution (kernel = stride = c) trained by the attention-reconstruction loss"},
          {"xmem_len", int64_t{0},
           "Memorizing Transformer: one layer also attends to the top model.xmem_topk of the keys and values of "
           "this many past positions, an external memory without gradient, through a learned gate per head (0: off)"},
          {"xmem_layer", int64_t{-1}, "Memorizing Transformer: the layer with the external memory (-1: the one below "
                                      "the top)"},
          {"xmem_topk", int64_t{32}, "Memorizing Transformer: (key, value) pairs retrieved per query"},
          {"xmem_gate_bias", 0.0,
           "Memorizing Transformer: each head's gate bias b at initialisation, g = sigmoid(b) the share of the "
           "memory's attention (0: half; below 0: local attention first)"}};
}

void check_memory(const ModelConfig& cfg) {
  const int64_t m = cfg.option_int("mem_len"), e = cfg.option_int("ext_len");
  TAPEFORMER_CHECK(m >= 0 && m <= 1 << 20, "model.mem_len must be in [0, 2^20], got ", m);
  TAPEFORMER_CHECK(m == 0 || attention_kinds().get(cfg.attention).segment_memory, "model.mem_len = ", m,
                   " needs an attention kind that takes a segment memory; model.attention \"", cfg.attention,
                   "\" does not");
  TAPEFORMER_CHECK(e >= 0 && e <= cfg.block_size, "model.ext_len must be in [0, model.block_size = ", cfg.block_size,
                   "], got ", e);
  TAPEFORMER_CHECK(e == 0 || m > 0, "model.ext_len = ", e, " needs a memory: set model.mem_len > 0");
  TAPEFORMER_CHECK(m == 0 || cfg.causal, "model.mem_len = ", m, " needs a causal model (ModelConfig::causal)");
  const Memorizing x = Memorizing::of(cfg);
  TAPEFORMER_CHECK(x.len >= 0 && x.len <= 1 << 20, "model.xmem_len must be in [0, 2^20], got ", x.len);
  if (x.len == 0) {
    TAPEFORMER_CHECK(cfg.option_int("xmem_layer") == -1 && x.top_k == 32 && x.gate_bias == 0,
                     "model.xmem_layer, model.xmem_topk and model.xmem_gate_bias apply only with an external memory: "
                     "set model.xmem_len > 0, or leave them at their defaults");
  } else {
    TAPEFORMER_CHECK(m > 0, "model.xmem_len = ", x.len, " is carried across segments like the memory: set "
                     "model.mem_len > 0");
    TAPEFORMER_CHECK(x.layer < cfg.n_layer && cfg.option_int("xmem_layer") >= -1, "model.xmem_layer must be in [-1, ",
                     cfg.n_layer - 1, "] (model.n_layer = ", cfg.n_layer, "), got ", cfg.option_int("xmem_layer"));
    TAPEFORMER_CHECK(std::isfinite(x.gate_bias) && std::fabs(x.gate_bias) <= 30,
                     "model.xmem_gate_bias must be a number in [-30, 30], got ", x.gate_bias);
    TAPEFORMER_CHECK(x.top_k >= 1 && x.top_k <= x.len, "model.xmem_topk must be in [1, model.xmem_len = ", x.len,
                     "], got ", x.top_k);
  }
  const MemoryCompression c = MemoryCompression::of(cfg);
  TAPEFORMER_CHECK(c.len >= 0 && c.len <= 1 << 20, "model.cmem_len must be in [0, 2^20], got ", c.len);
  TAPEFORMER_CHECK(c.ratio >= 1 && c.ratio <= 1024, "model.cmem_ratio must be in [1, 1024], got ", c.ratio);
  TAPEFORMER_CHECK(c.fn == "mean" || c.fn == "max" || c.fn == "conv",
                   "model.cmem_fn must be \"mean\", \"max\" or \"conv\", got \"", c.fn, "\"");
  if (c.len == 0) {
    TAPEFORMER_CHECK(c.ratio == 2 && c.fn == "mean", "model.cmem_ratio and model.cmem_fn apply only with a "
                     "compressed memory: set model.cmem_len > 0, or leave them at their defaults");
    return;
  }
  TAPEFORMER_CHECK(m > 0, "model.cmem_len = ", c.len, " compresses what falls out of the memory: set model.mem_len > 0");
  TAPEFORMER_CHECK(e == 0, "model.cmem_len with model.ext_len = ", e, ": a compressed memory needs ext_len 0");
  TAPEFORMER_CHECK(m % c.ratio == 0 && cfg.block_size % c.ratio == 0, "model.cmem_ratio = ", c.ratio,
                   " must divide model.mem_len (", m, ") and model.block_size (", cfg.block_size,
                   "), so that whole groups of rows fall out of the memory");
}

BlockKind standard_block_kind() {
  BlockKind kind;
  kind.name = "standard";
  kind.summary = "pre-LN residual blocks x += attn(ln_1(x)); x += mlp(ln_2(x)) (GPT-2, nanoGPT), every activation kept for "
                 "the backward";
  kind.options = memory_options();
  kind.make = [](const ModelConfig& cfg, const Positional& positional, Rng& rng) {
    return std::make_shared<StandardStack>(cfg, positional, rng);
  };
  kind.parameters = transformer_stack_parameters;
  kind.activation_floats = transformer_stack_activation_floats;
  kind.check = check_memory;
  return kind;
}

}  // namespace tapeformer
