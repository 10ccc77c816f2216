// Gates g(x, y) (GTrXL, Parisotto et al. 2020 §3.2): how a branch
// output y enters the residual stream x in a gated block, with kinds a config
// selects by name (`model.gate`).
//
//   std::shared_ptr<Gate> gate = gate_kinds().get("gru").make(/*C=*/128, /*bias=*/2.0f, rng);
//   Var out = gate->forward(x, y);          // (B, T, C) x 2 -> (B, T, C)
//
// Kinds (W, U: (C, C) blocks, N(0, 0.02); b: a learned (C) bias starting at
// model.gate_bias, the paper's b_g):
//   none      x + y                                            (TrXL-I)
//   input     sigmoid(x W) x + y
//   output    x + sigmoid(x W - b) y
//   highway   sigmoid(x W + b) x + (1 - sigmoid(x W + b)) y
//   sigtanh   x + sigmoid(y W - b) tanh(y U)
//   gru       (1 - z) x + z h, z = sigmoid(y W_z + x U_z - b), r = sigmoid(y W_r + x U_r),
//             h = tanh(y W_g + (r x) U_g)    (the fused op gru_gate, autograd/ops.h)
// With b > 0 each gate starts near the identity on x (GRU: z ~ sigmoid(-2) = 0.12).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "tapeformer/core/registry.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/layers/module.h"

namespace tapeformer {

class Gate : public Module {
 public:
  // x: the residual stream, y: the branch output, both (B, T, C) -> (B, T, C).
  virtual Var forward(const Var& x, const Var& y) const = 0;
};

struct GateKind {
  std::string name;
  std::string summary;  // one line, for docs
  std::function<std::shared_ptr<Gate>(int64_t C, float bias, Rng&)> make;
  std::function<double(double C)> parameters;  // of one gate of width C
};

// The table of gates (layers/block/gates.cpp); a program may add its own.
Registry<GateKind>& gate_kinds();

}  // namespace tapeformer
