// Global-norm gradient clipping (torch.nn.utils.clip_grad_norm_, L2).
//
//   const float norm = clip_grad_norm(model.parameters(), /*max_norm=*/1.0f);
//   if (!std::isfinite(norm)) ...  // report; gradients were left as they were
//
// Contract
// - norm = sqrt(sum over every element of every gradient of g^2), accumulated
//   in double in a fixed order (parameter order, fixed-size blocks), so it is
//   the same for any thread count. Parameters without a gradient are skipped;
//   pass each Var once (Module::parameters() already dedups tied weights).
// - coef = max_norm / (norm + 1e-6) in float, as PyTorch; when coef < 1 every
//   gradient is multiplied by coef in place. Otherwise (including
//   max_norm = +inf, "no clipping") gradients are unchanged.
// - A NaN or infinite norm is returned without touching the gradients (PyTorch
//   would multiply them by NaN); the caller decides what to report.
// - Returns the pre-clip norm. max_norm must be > 0 (may be +inf).
#pragma once

#include <vector>

#include "autograd/var.h"

namespace tapeformer {

float clip_grad_norm(const std::vector<Var>& params, float max_norm);

}  // namespace tapeformer
