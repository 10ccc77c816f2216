// The table of block kinds.
#include "tapeformer/layers/block/block.h"

#include <algorithm>
#include <string>
#include <utility>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"

namespace tapeformer {

// Each kind's entry, defined in its own file.
BlockKind standard_block_kind();    // standard.cpp
BlockKind reversible_block_kind();  // reversible.cpp
BlockKind post_ln_block_kind();     // post_ln.cpp
BlockKind gtrxl_block_kind();       // gtrxl.cpp
BlockKind universal_block_kind();   // universal.cpp

Registry<BlockKind>& block_kinds() {
  static Registry<BlockKind> kinds("model.block", {standard_block_kind(), reversible_block_kind(), post_ln_block_kind(),
                                                 gtrxl_block_kind(), universal_block_kind()});
  return kinds;
}

void BlockStack::set_recompute(int64_t every) {
  TAPEFORMER_CHECK(every >= 0, "block stack: recompute every ", every, " layers: must be >= 0 (0: none)");
  recompute_every_ = every;
}

Var BlockStack::forward(const Var&, SegmentMemory&, Rng&) const {
  std::string carriers;
  for (const BlockKind& k : block_kinds().kinds())
    if (k.memory) carriers += (carriers.empty() ? "\"" : ", \"") + k.name + "\"";
  fail("this block stack keeps no segment memory (model.mem_len needs model.block ", carriers, ")");
}

}  // namespace tapeformer
