// Transformer-XL's segment memory (Dai et al. 2019 §3.2), the memory kind
// "xl": each layer also attends to its own inputs at the last M <=
// model.mem_len positions before the segment, kept without gradient and
// carried from one training step to the next (group "layers", (B, M, C) per
// layer). With model.ext_len = e the last e tokens of a segment are read
// again at the start of the next and stay out of the memory.
#pragma once

#include <cstdint>

#include "tapeformer/autograd/var.h"

namespace tapeformer {

// The new memory of one layer: the last mem_len rows of [old; x], (B, <= mem_len, C),
// detached (Transformer-XL's _update_mems with ext_len = 0).
Tensor next_memory(const Tensor& old, const Var& x, int64_t mem_len);

// memory becomes the last mem_len rows of [memory; x] (x (B, T, C), taken
// without gradient); returns the rows that fell out, oldest first (B, F, C),
// undefined when none did.
Tensor evict_rows(Tensor& memory, const Var& x, int64_t mem_len);

}  // namespace tapeformer
