#include "tapeformer/layers/block/gtrxl.h"

#include <cmath>
#include <string>

#include "tapeformer/core/error.h"

namespace tapeformer {

GatedBlock::GatedBlock(const ModelConfig& cfg, const Positional& positional, Rng& rng) {
  const GateKind& gate = gate_kinds().get(cfg.option_string("gate"));
  const auto bias = static_cast<float>(cfg.option_number("gate_bias"));
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias, cfg.norm_eps));
  attn = register_module("attn", make_attention(cfg, positional.make_layer(rng), rng));
  gate_1 = register_module("gate_1", gate.make(cfg.n_embd, bias, rng));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias, cfg.norm_eps));
  mlp = register_module("mlp", make_mlp(cfg, rng));
  gate_2 = register_module("gate_2", gate.make(cfg.n_embd, bias, rng));
}

Var GatedBlock::forward(const Var& e, Rng& rng) const { return forward(e, Tensor(), rng); }

Var GatedBlock::forward(const Var& e, InferenceState& state) const {
  const Var y = gate_1->forward(e, relu(attn->forward(ln_1->forward(e), state)));
  Rng unused(0);  // eval mode: no dropout draws
  return gate_2->forward(y, relu(mlp->forward(ln_2->forward(y), unused)));
}

Var GatedBlock::forward(const Var& e, const Tensor& memory, Rng& rng) const {
  const Var y = gate_1->forward(e, relu(attend_normalised(*attn, *ln_1, e, memory, rng)));
  return gate_2->forward(y, relu(mlp->forward(ln_2->forward(y), rng)));
}

BlockKind gtrxl_block_kind() {
  BlockKind kind;
  kind.name = "gtrxl";
  kind.summary = "GTrXL (Parisotto et al. 2020): y = gate_1(x, relu(attn(ln_1(x)))); x' = gate_2(y, relu(mlp(ln_2(y)))), "
                 "model.gate picks the gate";
  kind.options = {{"gate", std::string("gru"), "gtrxl blocks: none | input | output | highway | sigtanh | gru"},
                  {"gate_bias", 2.0, "gtrxl blocks: the gates' initial bias b_g (the paper: 2 for gru, 1 for the others)"}};
  kind.make = [](const ModelConfig& cfg, const Positional& positional, Rng& rng) {
    return std::make_shared<GatedStack>(cfg, positional, rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    const double gates = 2 * gate_kinds().get(cfg.option_string("gate")).parameters(static_cast<double>(cfg.n_embd));
    return static_cast<double>(cfg.n_layer) * (transformer_block_parameters(cfg) + gates) + memory_parameters(cfg);
  };
  kind.check = [](const ModelConfig& cfg) {
    gate_kinds().get(cfg.option_string("gate"));  // Error naming model.gate and the known gates
    const double b = cfg.option_number("gate_bias");
    TAPEFORMER_CHECK(std::isfinite(b), "model.gate_bias must be a finite number, got ", b);
  };
  kind.memory = true;
  return kind;
}

}  // namespace tapeformer
