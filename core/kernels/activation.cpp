#include "core/kernels/activation_packet.h"

#include <algorithm>

namespace tapeformer::kernels {

void activate_rows(Activation act, Scalar* y, Scalar* dydx, int64_t n) {
  using namespace Eigen::internal;
  constexpr int64_t L = eigen::kPacketSize;
  // Whole packets, then the tail through masked loads and stores, so every
  // element goes through the same packet math (Eigen's own array maps would
  // send the tail through std::tanh, a slightly different function).
  for (int64_t i = 0; i < n; i += L) {
    const int64_t lanes = std::min(L, n - i);
    const eigen::Packet z = lanes == L ? ploadu<eigen::Packet>(y + i) : eigen::load_first(y + i, lanes);
    eigen::Packet out, d;
    activate(act, z, out, d);
    if (lanes == L) {
      pstoreu(y + i, out);
      if (dydx) pstoreu(dydx + i, d);
    } else {
      eigen::store_first(y + i, out, lanes);
      if (dydx) eigen::store_first(dydx + i, d, lanes);
    }
  }
}

}  // namespace tapeformer::kernels
