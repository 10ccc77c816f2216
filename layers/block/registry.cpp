// The table of block kinds.
#include "layers/block/block.h"

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

}  // namespace tapeformer
