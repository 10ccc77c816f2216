#include "layers/block/gtrxl.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace tapeformer {

GatedBlock::GatedBlock(const ModelConfig& cfg, const Positional& positional, Rng& rng) {
  const GateKind& gate = gate_kinds().get(cfg.option_string("gate"));
  const auto bias = static_cast<float>(cfg.option_number("gate_bias"));
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  attn = register_module("attn", attention_kinds().get(cfg.attention).make(cfg, positional.make_layer(rng), rng));
  gate_1 = register_module("gate_1", gate.make(cfg.n_embd, bias, rng));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  mlp = register_module("mlp", std::make_shared<FeedForward>(cfg.n_embd, 4 * cfg.n_embd, cfg.bias, cfg.dropout,
                                                             cfg.activation, residual_init_std(cfg), rng));
  gate_2 = register_module("gate_2", gate.make(cfg.n_embd, bias, rng));
}

Var GatedBlock::forward(const Var& e, Rng& rng) const {
  const Var y = gate_1->forward(e, relu(attn->forward(ln_1->forward(e), rng)));
  return gate_2->forward(y, relu(mlp->forward(ln_2->forward(y), rng)));
}

Var GatedBlock::forward(const Var& e, InferenceState& state) const {
  const Var y = gate_1->forward(e, relu(attn->forward(ln_1->forward(e), state)));
  Rng unused(0);  // eval mode: no dropout draws
  return gate_2->forward(y, relu(mlp->forward(ln_2->forward(y), unused)));
}

Var GatedBlock::forward(const Var& e, const Tensor& memory, Rng& rng) const {
  if (!memory.defined() || memory.dim(1) == 0) return forward(e, rng);
  const Var y = gate_1->forward(e, relu(attn->forward(ln_1->forward(e), ln_1->forward(Var(memory)), rng)));
  return gate_2->forward(y, relu(mlp->forward(ln_2->forward(y), rng)));
}

GatedStack::GatedStack(const ModelConfig& cfg, const Positional& positional, Rng& rng)
    : mem_len(cfg.option_int("mem_len")) {
  for (int64_t i = 0; i < cfg.n_layer; ++i)
    blocks.push_back(register_module(std::to_string(i), std::make_shared<GatedBlock>(cfg, positional, rng)));
}

Var GatedStack::forward(const Var& x_in, Rng& rng) const {
  Var x = x_in;
  for (const auto& block : blocks) x = block->forward(x, rng);
  return x;
}

std::unique_ptr<InferenceState> GatedStack::make_state(int64_t batch, int64_t window) const {
  auto state = std::make_unique<LayerStates>();
  for (const auto& block : blocks) state->layers.push_back(block->attn->make_state(batch, window));
  return state;
}

Var GatedStack::forward(const Var& x_in, InferenceState& state) const {
  LayerStates& s = state_as<LayerStates>(state, "GatedStack", "layer states");
  TAPEFORMER_CHECK(s.layers.size() == blocks.size(), "GatedStack: a state of ", s.layers.size(),
                   " layers for a stack of ", blocks.size());
  Var x = x_in;
  for (size_t i = 0; i < blocks.size(); ++i) x = blocks[i]->forward(x, *s.layers[i]);
  s.advance(x_in.dim(1));
  return x;
}

Var GatedStack::forward(const Var& x_in, SegmentMemory& memory, Rng& rng) const {
  TAPEFORMER_CHECK(mem_len > 0, "GatedStack: a segment memory needs model.mem_len > 0");
  memory.layers.resize(blocks.size());
  Var x = x_in;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Var in = x;
    x = blocks[i]->forward(in, memory.layers[i], rng);
    memory.layers[i] = next_memory(memory.layers[i], in, memory.limit > 0 ? memory.limit : mem_len);
  }
  return x;
}

BlockKind gtrxl_block_kind() {
  BlockKind kind;
  kind.name = "gtrxl";
  kind.summary = "GTrXL: LN on branch inputs, ReLU on branch outputs, gated residuals (SPEC §5)";
  kind.options = {{"gate", std::string("gru"), "gtrxl blocks: none | input | output | highway | sigtanh | gru"},
                  {"gate_bias", 2.0, "gtrxl blocks: the gates' initial bias b_g (the paper: 2 for gru, 1 for the others)"},
                  mem_len_option()};
  kind.make = [](const ModelConfig& cfg, const Positional& positional, Rng& rng) {
    return std::make_shared<GatedStack>(cfg, positional, rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    const double gates = 2 * gate_kinds().get(cfg.option_string("gate")).parameters(static_cast<double>(cfg.n_embd));
    return static_cast<double>(cfg.n_layer) * (transformer_block_parameters(cfg) + gates);
  };
  kind.activation_floats = [](const ModelConfig& cfg, int64_t T) {
    return static_cast<double>(cfg.n_layer) * transformer_block_activation_floats(cfg, T);
  };
  kind.check = [](const ModelConfig& cfg) {
    gate_kinds().get(cfg.option_string("gate"));  // Error naming model.gate and the known gates
    const double b = cfg.option_number("gate_bias");
    TAPEFORMER_CHECK(std::isfinite(b), "model.gate_bias must be a finite number, got ", b);
    check_mem_len(cfg);
  };
  return kind;
}

}  // namespace tapeformer
