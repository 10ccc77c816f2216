// Global-norm gradient clipping (torch.nn.utils.clip_grad_norm_, L2).
//
//   const float norm = clip_grad_norm(model.parameters(), /*max_norm=*/1.0f);
//   if (!std::isfinite(norm)) ...  // report; gradients were left as they were
//
// or, without touching the gradients, folding the factor into the update:
//
//   const float norm = grad_norm(model.parameters());
//   optimizer.step(clip_coefficient(norm, 1.0f));
//
// Contract
// - norm = sqrt(sum over every element of every gradient of g^2): blocks of
//   kNormBlock elements are summed in float (in double when the float sum
//   overflows, so any finite gradient has a finite norm) and the blocks are
//   added in double in a fixed order (parameter order, then position), so the
//   norm is the same for any thread count. Parameters without a gradient are
//   skipped; pass each Var once (Module::parameters() already dedups tied
//   weights).
// - coef = max_norm / (norm + 1e-6) in float, as PyTorch; clipping happens
//   when coef < 1. Otherwise (including max_norm = +inf, "no clipping") the
//   coefficient is 1 and gradients are unchanged.
// - clip_grad_norm multiplies the gradients by coef in place. A NaN or
//   infinite norm is returned without touching them (PyTorch would multiply
//   them by NaN); the caller decides what to report.
// - max_norm must be > 0 (may be +inf); the error names the function.
#pragma once

#include <vector>

#include "tapeformer/autograd/var.h"

namespace tapeformer {

constexpr int64_t kNormBlock = 1 << 14;

// The global L2 norm of the parameters' gradients.
float grad_norm(const std::vector<Var>& params);

// The factor clip_grad_norm applies for a given norm: min(1, max_norm / (norm
// + 1e-6)); 1 when the norm is not finite.
float clip_coefficient(float norm, float max_norm);

// Scales the gradients in place when their norm exceeds max_norm; returns the
// pre-clip norm.
float clip_grad_norm(const std::vector<Var>& params, float max_norm);

}  // namespace tapeformer
