// The table of positional schemes.
#include "tapeformer/layers/positional/positional.h"

namespace tapeformer {

// Each scheme's entry, defined in its own file.
PositionalKind learned_positional_kind();     // learned.cpp
PositionalKind sinusoidal_positional_kind();  // sinusoidal.cpp
PositionalKind rope_positional_kind();        // rope.cpp
PositionalKind alibi_positional_kind();       // alibi.cpp
PositionalKind shaw_positional_kind();        // shaw.cpp
PositionalKind txl_positional_kind();         // txl.cpp

Registry<PositionalKind>& positional_kinds() {
  static Registry<PositionalKind> kinds("model.positional",
                                        {learned_positional_kind(), sinusoidal_positional_kind(),
                                         rope_positional_kind(), alibi_positional_kind(), shaw_positional_kind(),
                                         txl_positional_kind()});
  return kinds;
}

}  // namespace tapeformer
