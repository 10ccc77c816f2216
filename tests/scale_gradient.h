// ScaleGradient: the identity whose backward multiplies the gradient by k.
// Wrapped around a value inside a gradchecked function it makes the analytic
// gradient wrong by a known factor, so a test can show that gradcheck, with
// the tolerances it uses, fails on a backward that is off by a few percent.
#pragma once

#include <vector>

#include "tapeformer/autograd/function.h"

namespace tapeformer {

struct ScaleGradient : Function {
  explicit ScaleGradient(Scalar k) : k_(k) {}
  const char* name() const override { return "scale_gradient"; }
  std::vector<Tensor> forward(FunctionContext&, const std::vector<Tensor>& in) override { return {in[0].clone()}; }
  std::vector<Tensor> backward(FunctionContext&, const std::vector<Tensor>& d) override {
    Tensor g = d[0].contiguous().clone();
    for (int64_t i = 0; i < g.numel(); ++i) g.data()[i] *= k_;
    return {g};
  }
  Scalar k_;
};

// scale_gradient(x, k): x in the forward pass, k * dx in the backward pass.
inline Var scale_gradient(const Var& x, Scalar k) { return Function::apply<ScaleGradient>({x}, k)[0]; }

}  // namespace tapeformer
