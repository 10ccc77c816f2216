// The table of block kinds.
#include "tapeformer/layers/block/block.h"

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"

namespace tapeformer {

// Each kind's entry, defined in its own file.
BlockKind standard_block_kind();    // standard.cpp
BlockKind reversible_block_kind();  // reversible.cpp
BlockKind post_ln_block_kind();     // post_ln.cpp
BlockKind gtrxl_block_kind();       // gtrxl.cpp

Registry<BlockKind>& block_kinds() {
  static Registry<BlockKind> kinds("model.block", {standard_block_kind(), reversible_block_kind(), post_ln_block_kind(),
                                                 gtrxl_block_kind()});
  return kinds;
}

Var BlockStack::forward(const Var&, SegmentMemory&, Rng&) const {
  fail("this block stack keeps no segment memory (model.mem_len needs model.block \"standard\", \"post_ln\" or "
       "\"gtrxl\")");
}

Tensor next_memory(const Tensor& old, const Var& x, int64_t mem_len) {
  const Tensor cat = old.defined() && old.dim(1) > 0 ? concat({Var(old), detach(x)}, 1).value() : x.value();
  const int64_t n = cat.dim(1), keep = std::min(n, mem_len);
  return cat.slice(1, n - keep, n).contiguous();  // (B, keep, C)
}

}  // namespace tapeformer
