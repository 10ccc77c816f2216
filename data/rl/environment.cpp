// The table of environments.
#include "tapeformer/data/rl/environment.h"

#include <algorithm>
#include <cstdint>

#include "tapeformer/core/error.h"

namespace tapeformer {

// Each kind's entry, defined in its own file.
EnvironmentKind keys_doors_environment_kind();  // keys_doors.cpp
EnvironmentKind tmaze_environment_kind();       // tmaze.cpp

Registry<EnvironmentKind>& environment_kinds() {
  static Registry<EnvironmentKind> kinds("--env", {keys_doors_environment_kind(), tmaze_environment_kind()});
  return kinds;
}

std::pair<int64_t, int64_t> return_bounds(const Environment& env) {
  const auto [lo, hi] = env.reward_range();
  const int64_t steps = env.max_steps();
  TAPEFORMER_CHECK(lo <= hi && steps >= 1, "environment \"", env.name(), "\": reward range [", lo, ", ", hi,
                   "] with a step cap of ", steps);
  // A return to go is the target less the return so far, so the whole span
  // of returns must fit; per step it is below 2^32 and steps are checked
  // against the quotient, so the products never overflow.
  constexpr int64_t kMax = INT32_MAX;
  const int64_t span = std::max<int64_t>(0, hi) - std::min<int64_t>(0, lo);
  TAPEFORMER_CHECK(span == 0 || steps <= kMax / span, "environment \"", env.name(), "\": ", steps,
                   " steps of rewards in [", lo, ", ", hi, "] span more returns than the 32-bit integer a return ",
                   "to go is stored in holds (", kMax, ")");
  return {std::min<int64_t>(0, lo) * steps, std::max<int64_t>(0, hi) * steps};
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
