#include "tapeformer/core/kernels/activation_packet.h"

#include <algorithm>

namespace tapeformer::kernels {

void activate_rows(Activation act, Scalar* y, Scalar* dydx, int64_t n) {
  constexpr int64_t L = eigen::kPacketSize;
  // Whole packets, then the tail through masked loads and stores, so every
  // element goes through the same packet math (Eigen's own array maps would
  // send the tail through std::tanh, a slightly different function).
  for (int64_t i = 0; i < n; i += L) {
    const int64_t lanes = std::min(L, n - i);
    eigen::Packet out, d;
    activate(act, eigen::load_upto(y + i, lanes), out, d);
    eigen::store_upto(y + i, out, lanes);
    if (dydx) eigen::store_upto(dydx + i, d, lanes);
  }
}

}  // namespace tapeformer::kernels
