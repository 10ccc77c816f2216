// The packet math of the activations (see activation.h), inline for the
// GEMM epilogue. Internal to core/kernels.
#pragma once

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/kernels/activation.h"

namespace tapeformer::kernels {

// GELU in GPT-2's tanh form, t = tanh(k (z + c z^3)) with k = sqrt(2 / pi), c = 0.044715:
//   y = z (1 + t) / 2,   dy/dz = (1 + t) / 2 + z (1 - t^2) k (1 + 3 c z^2) / 2.
// ReLU: y = max(z, 0), dy/dz = [z > 0].
// SiLU (swish): s = 1 / (1 + e^-z),  y = z s,  dy/dz = s (1 + z (1 - s)).
// y and dydx may alias z.
// P: eigen::Packet (activate_rows) or eigen::NativePacket (the GEMM's
// epilogue); a lane's bits are the same in both.
template <class P>
inline void activate(Activation act, const P& z_in, P& y, P& dydx) {
  using namespace Eigen::internal;
  const P z = z_in;
  if (act == Activation::Relu) {
    const P zero = pset1<P>(0.0f);
    dydx = pand(pcmp_lt(zero, z), pset1<P>(1.0f));
    y = pmax(z, zero);
    return;
  }
  if (act == Activation::Silu) {
    const P one = pset1<P>(1.0f);
    const P s = pdiv(one, padd(one, eigen::exp(pnegate(z))));  // e^-z = inf for z < -88: s = 0, y = -0
    dydx = pmul(s, pmadd(z, psub(one, s), one));
    y = pmul(z, s);
    return;
  }
  // Every multiply-add is an explicit pmadd and no product feeds an add:
  // the compiler's own contraction (-ffp-contract) then has nothing to fuse,
  // so this gives the same bits inlined in the GEMM's epilogue as in
  // activate_rows.
  const P k = pset1<P>(0.7978845608028654f), c = pset1<P>(0.044715f), c3 = pset1<P>(3 * 0.044715f);
  const P half = pset1<P>(0.5f), one = pset1<P>(1.0f);
  const P z2 = pmul(z, z);
  const P t = eigen::tanh(pmul(k, pmadd(pmul(c, z2), z, z)));  // tanh(k (z + c z^3))
  const P one_plus_t = padd(one, t);
  const P half_z = pmul(half, z);
  const P slope = pmul(pmul(pmul(half_z, pmadd(pnegate(t), t, one)), k), pmadd(c3, z2, one));
  dydx = pmadd(half, one_plus_t, slope);
  y = pmul(half_z, one_plus_t);
}

}  // namespace tapeformer::kernels
