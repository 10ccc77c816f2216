// Helpers the op tests share: random inputs, and an op run on fresh copies
// of its inputs with the value and every input's gradient kept.
//
//   const Tensor q = random({B, H, T, D}, rng);                 // N(0, 1), or N(0, scale^2)
//   const Run a = run([&](const std::vector<Var>& x) { return f(x[0], x[1]); }, {q, k}, R);
//   check_close(a.y, b.y, "value", 1e-5);   a.grads[i]: d sum(y * R) / d input i (undefined if none)
#pragma once

#include <functional>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/rng.h"

namespace tapeformer {

inline Tensor random(const Shape& s, Rng& rng, float scale = 1.0f) {
  Tensor t = Tensor::empty(s);
  rng.fill_normal(t, 0.0f, scale);
  return t;
}

struct Run {
  Tensor y;
  std::vector<Tensor> grads;
};

// f on fresh copies of the inputs, backward with the upstream gradient R.
inline Run run(const std::function<Var(const std::vector<Var>&)>& f, const std::vector<Tensor>& inputs,
               const Tensor& R) {
  std::vector<Var> vars;
  for (const Tensor& t : inputs) vars.emplace_back(t.clone(), true);
  TapeScope tape;
  const Var y = f(vars);
  backward(y, R);
  Run r{y.value(), {}};
  for (const Var& v : vars) r.grads.push_back(v.has_grad() ? v.grad() : Tensor());
  return r;
}

}  // namespace tapeformer
