#include "tapeformer/core/build_info.h"

#include "tapeformer/core/eigen.h"

namespace tapeformer {

std::string vector_description() {
  std::string s = std::to_string(eigen::kPacketSize) + "-float packets in " + std::to_string(eigen::kNativePacketSize) +
                  "-float registers";
#ifdef EIGEN_VECTORIZE_FMA
  s += ", FMA";
#endif
  return s + " (" + Eigen::SimdInstructionSetsInUse() + ")";
}

}  // namespace tapeformer
