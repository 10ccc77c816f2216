// Global-norm gradient clipping (torch.nn.utils.clip_grad_norm_).
#pragma once

#include <vector>

#include "autograd/var.h"

namespace tapeformer {

// Returns the L2 norm of all gradients together (before clipping). When it
// exceeds max_norm, scales every gradient in place by max_norm / (norm + 1e-6).
// A non-finite norm is returned without scaling (the trainer reports it).
float clip_grad_norm(const std::vector<Var>& params, float max_norm);

}  // namespace tapeformer
