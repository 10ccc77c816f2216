// Vector loops over a row that give the same bits wherever the row lies in
// memory: whole packets from index 0, then one masked packet, so every entry
// takes the same path (Eigen's packet exp, fused multiply-adds, the lane
// order of a reduction). Eigen's own expressions over maps peel scalars up
// to the first aligned address, so with per-thread workspaces their results
// would depend on the allocation (and a causality probe or a resume would
// see different bits for the same numbers).
//
//   vec::dot(x, y, n)      sum_i x_i y_i        vec::axpy(x, e, v, n)   x += e v
//   vec::sum(x, n)         sum_i x_i            vec::mul_add(x, a, b, n) x += a * b
//   vec::packets(n, [&](int64_t i, int64_t l) { ... load_upto(p + i, l) ... store_upto(q + i, .., l); });
#pragma once

#include <cstdint>

#include "tapeformer/core/eigen.h"

namespace tapeformer::kernels::vec {

using eigen::load_upto;
using eigen::Packet;
using eigen::store_upto;

// fn(i, l) for entries [i, i + l): l = the packet size, then the remainder once.
template <class F>
void packets(int64_t n, F&& fn) {
  constexpr int64_t L = eigen::kPacketSize;
  int64_t i = 0;
  for (; i + L <= n; i += L) fn(i, L);
  if (i < n) fn(i, n - i);
}

inline Scalar dot(const Scalar* x, const Scalar* y, int64_t n) {
  Packet acc = Eigen::internal::pset1<Packet>(0.0f);
  packets(n, [&](int64_t i, int64_t l) {
    acc = Eigen::internal::pmadd(load_upto(x + i, l), load_upto(y + i, l), acc);
  });
  return Eigen::internal::predux(acc);
}

inline Scalar sum(const Scalar* x, int64_t n) {
  Packet acc = Eigen::internal::pset1<Packet>(0.0f);
  packets(n, [&](int64_t i, int64_t l) { acc = Eigen::internal::padd(load_upto(x + i, l), acc); });
  return Eigen::internal::predux(acc);
}

// x += e v
inline void axpy(Scalar* x, Scalar e, const Scalar* v, int64_t n) {
  const Packet pe = Eigen::internal::pset1<Packet>(e);
  packets(n, [&](int64_t i, int64_t l) {
    store_upto(x + i, Eigen::internal::pmadd(pe, load_upto(v + i, l), load_upto(x + i, l)), l);
  });
}

// x += a * b, elementwise
inline void mul_add(Scalar* x, const Scalar* a, const Scalar* b, int64_t n) {
  packets(n, [&](int64_t i, int64_t l) {
    store_upto(x + i, Eigen::internal::pmadd(load_upto(a + i, l), load_upto(b + i, l), load_upto(x + i, l)), l);
  });
}

}  // namespace tapeformer::kernels::vec
