// The table of environments.
#include "tapeformer/data/rl/environment.h"

#include "tapeformer/core/error.h"

namespace tapeformer {

// Each kind's entry, defined in its own file.
EnvironmentKind keys_doors_environment_kind();  // keys_doors.cpp
EnvironmentKind tmaze_environment_kind();       // tmaze.cpp

Registry<EnvironmentKind>& environment_kinds() {
  static Registry<EnvironmentKind> kinds("--env", {keys_doors_environment_kind(), tmaze_environment_kind()});
  return kinds;
}

EnvironmentOptions environment_options(const EnvironmentKind& kind, const EnvironmentOptions& given) {
  EnvironmentOptions out = kind.options;
  for (const auto& [name, value] : given) {
    std::string known;
    for (const auto& [k, v] : kind.options) known += (known.empty() ? "" : ", ") + k;
    TAPEFORMER_CHECK(kind.options.count(name) == 1, "environment \"", kind.name, "\" has no option \"", name, "\" (",
                     known.empty() ? std::string("it has none") : "it has " + known, ")");
    out[name] = value;
  }
  return out;
}

}  // namespace tapeformer
