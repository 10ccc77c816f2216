#include "tapeformer/layers/block/gates.h"

#include "tapeformer/autograd/ops.h"
#include "tapeformer/layers/basic.h"

namespace tapeformer {
namespace {

// A parameter of `shape` drawn from N(0, 0.02) (GPT-2's init, as Linear's).
Tensor weight(const Shape& shape, Rng& rng) {
  Tensor t = Tensor::empty(shape);
  rng.fill_normal(t, 0.0f, kInitStd);
  return t;
}

Tensor filled(int64_t C, float value) {
  Tensor t = Tensor::empty({C});
  t.fill(value);
  return t;
}

Var one_minus(const Var& s) { return add_scalar(neg(s), 1.0f); }

class SumGate : public Gate {
 public:
  Var forward(const Var& x, const Var& y) const override { return add(x, y); }
};

class InputGate : public Gate {
 public:
  InputGate(int64_t C, Rng& rng) { w = register_parameter("w", weight({C, C}, rng)); }
  Var forward(const Var& x, const Var& y) const override { return add(mul(sigmoid(matmul(x, w)), x), y); }
  Var w;  // (C, C)
};

class OutputGate : public Gate {
 public:
  OutputGate(int64_t C, float bias, Rng& rng) {
    w = register_parameter("w", weight({C, C}, rng));
    b = register_parameter("b", filled(C, bias));
  }
  Var forward(const Var& x, const Var& y) const override { return add(x, mul(sigmoid(sub(matmul(x, w), b)), y)); }
  Var w, b;  // (C, C), (C)
};

class HighwayGate : public Gate {
 public:
  HighwayGate(int64_t C, float bias, Rng& rng) {
    w = register_parameter("w", weight({C, C}, rng));
    b = register_parameter("b", filled(C, bias));
  }
  Var forward(const Var& x, const Var& y) const override {
    const Var s = sigmoid(add(matmul(x, w), b));  // (B, T, C)
    return add(mul(s, x), mul(one_minus(s), y));
  }
  Var w, b;  // (C, C), (C)
};

class SigTanhGate : public Gate {
 public:
  SigTanhGate(int64_t C, float bias, Rng& rng) {
    w = register_parameter("w", weight({C, C}, rng));
    u = register_parameter("u", weight({C, C}, rng));
    b = register_parameter("b", filled(C, bias));
  }
  Var forward(const Var& x, const Var& y) const override {
    return add(x, mul(sigmoid(sub(matmul(y, w), b)), tanh(matmul(y, u))));
  }
  Var w, u, b;  // (C, C), (C, C), (C)
};

class GruGateModule : public Gate {
 public:
  GruGateModule(int64_t C, float bias, Rng& rng) {
    w = register_parameter("w", weight({C, 3 * C}, rng));  // [W_r | W_z | W_g]
    u = register_parameter("u", weight({C, 2 * C}, rng));  // [U_r | U_z]
    ug = register_parameter("ug", weight({C, C}, rng));
    b = register_parameter("b", filled(C, bias));
  }
  Var forward(const Var& x, const Var& y) const override { return gru_gate(x, y, w, u, ug, b); }
  Var w, u, ug, b;
};

}  // namespace

Registry<GateKind>& gate_kinds() {
  static Registry<GateKind> kinds(
      "model.gate",
      {{"none", "x + y (TrXL-I: identity-map reordering without a gate)",
        [](int64_t, float, Rng&) { return std::make_shared<SumGate>(); }, [](double) { return 0.0; }},
       {"input", "sigmoid(x W) x + y", [](int64_t C, float, Rng& rng) { return std::make_shared<InputGate>(C, rng); },
        [](double C) { return C * C; }},
       {"output", "x + sigmoid(x W - b) y",
        [](int64_t C, float b, Rng& rng) { return std::make_shared<OutputGate>(C, b, rng); },
        [](double C) { return C * C + C; }},
       {"highway", "sigmoid(x W + b) x + (1 - sigmoid(x W + b)) y",
        [](int64_t C, float b, Rng& rng) { return std::make_shared<HighwayGate>(C, b, rng); },
        [](double C) { return C * C + C; }},
       {"sigtanh", "x + sigmoid(y W - b) tanh(y U)",
        [](int64_t C, float b, Rng& rng) { return std::make_shared<SigTanhGate>(C, b, rng); },
        [](double C) { return 2 * C * C + C; }},
       {"gru", "(1 - z) x + z h, GRU-type (the paper's best)",
        [](int64_t C, float b, Rng& rng) { return std::make_shared<GruGateModule>(C, b, rng); },
        [](double C) { return 6 * C * C + C; }}});
  return kinds;
}

}  // namespace tapeformer
