// gradcheck: compares the tape's gradients with central finite differences.
//
//   auto r = gradcheck([](const std::vector<Var>& v) { return tanh(matmul(v[0], v[1])); },
//                      {Tensor::from({3, 4}, ...), Tensor::from({4, 5}, ...)},
//                      "tanh(matmul)");
//   CHECK_MESSAGE(r.ok, r.message);
//
// The scalar checked is L = sum(f(x) * R) with a random upstream gradient R
// (fixed seed), evaluated in double from the float outputs, so a backward that
// only gets uniform upstream gradients right still fails. An element passes
// when |analytic - numeric| <= atol + rtol * |numeric|. The message reports
// the label, the input index, the element's index, both values and the
// tolerance, for the worst element.
//
// Inputs are used as given (contiguous or strided views); each is perturbed
// in place and restored, so inputs must not share storage with each other.
//
// Large outputs. Tensors are float32, so L itself is only known to about
// 2^-24 |f| |R| (a scalar near 3e4 moves in steps of 0.004), and with the
// default fixed step that rounding alone can exceed the tolerance:
// sum(x * x) over 1024 values near 10 fails although its backward is right.
// `extrapolate = true` is the mode for such functions:
//   - the step scales with the element, h = rel_step * max(step_floor, |x|) (step_floor 1 by default);
//   - the derivative is Richardson's combination of the central differences
//     at h and h/2, (4 D(h/2) - D(h)) / 3, exact to O(h^4);
//   - every evaluation's float rounding, noise = 4 * 2^-24 * sum_j |f_j R_j|,
//     enters the tolerance as 3 noise / h (what it can move that combination).
//   GradcheckOptions opt; opt.extrapolate = true;
//   gradcheck([](auto& v) { return sum(mul(v[0], v[0])); }, {x}, opt);   // x: 1024 values ~10
// A gradient 5% off still fails there (every op's row is checked that way).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tapeformer/autograd/var.h"

namespace tapeformer {

struct GradcheckOptions {
  double eps = 1e-3;   // finite-difference step (fixed-step mode)
  double atol = 1e-3;  // absolute tolerance
  double rtol = 1e-2;  // relative tolerance
  uint64_t seed = 0;   // seed for the random upstream gradient R
  std::string label = "f";
  bool extrapolate = false;  // scaled steps, Richardson, float-noise tolerance (above)
  double rel_step = 2e-2;    // extrapolate: h = rel_step * max(step_floor, |x|)
  // extrapolate: the smallest scale a step follows. 1 suits inputs of order
  // one; a model's initial weights (about 0.02) need a step of their own
  // scale, or the step moves a weight by as much as it is.
  double step_floor = 1.0;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;         // empty when ok; else the worst element
  double max_abs_error = 0.0;  // over all inputs and elements
  int64_t checked = 0;         // number of elements compared
  double noise = 0.0;          // extrapolate: the float rounding allowed in L
};

using GradcheckFn = std::function<Var(const std::vector<Var>&)>;

GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});
// Checks existing Vars in place, e.g. a module's parameters:
//   gradcheck_vars([&] { return loss_of(model); }, model.parameters(), opt);
// Their gradients are reset first and hold the analytic gradient afterwards.
GradcheckResult gradcheck_vars(const std::function<Var()>& f, const std::vector<Var>& vars,
                               const GradcheckOptions& options = {});
// Default tolerances, with `label` naming the function in the report.
GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                          const std::string& label);

}  // namespace tapeformer
