// Vector loops over a row that give the same bits wherever the row lies in
// memory and on every instruction set: whole 16-float packets from index 0,
// then one masked packet, so every entry takes the same path (the packet
// exp, fused multiply-adds, the lane order of a reduction: lane i sums the
// entries i, i + 16, ..., then eigen::sum's tree). Eigen's own expressions over maps peel scalars up
// to the first aligned address, so with per-thread workspaces their results
// would depend on the allocation (and a causality probe or a resume would
// see different bits for the same numbers).
//
//   vec::dot(x, y, n)      sum_i x_i y_i        vec::axpy(x, e, v, n)   x += e v
//   vec::sum(x, n)         sum_i x_i            vec::mul_add(x, a, b, n) x += a * b
//   vec::max(x, n)         max_i x_i            vec::sum_sq_dev(x, mu, n) sum_i (x_i - mu)^2
//   vec::sum_exp(x, m, n)  sum_i e^(x_i - m)    vec::exp_scalar(x)       one lane of the packet exp
//   vec::dist2(x, y, n)    sum_i (x_i - y_i)^2  vec::map(x, y, n, f)     y = f(x), f on packets
//   vec::sum_squares(x, n) sum_i x_i^2, four accumulators (long arrays)
//   vec::packets(n, [&](int64_t i, int64_t l) { ... load_upto(p + i, l) ... store_upto(q + i, .., l); });
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

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

// p with lanes [l, 16) set to 0: a row's last packet, whose empty lanes must add nothing.
inline Packet zero_after(const Packet& p, int64_t l) {
  alignas(64) Scalar v[eigen::kPacketSize];
  Eigen::internal::pstore(v, p);
  for (int64_t j = l; j < eigen::kPacketSize; ++j) v[j] = 0.0f;
  return Eigen::internal::pload<Packet>(v);
}
// The lane-wise max of acc and x on lanes [0, l) only; acc kept in the others.
inline Packet max_first(const Packet& acc, const Packet& x, int64_t l) {
  alignas(64) Scalar a[eigen::kPacketSize], v[eigen::kPacketSize];
  Eigen::internal::pstore(a, acc);
  Eigen::internal::pstore(v, x);
  for (int64_t j = 0; j < l; ++j) a[j] = a[j] < v[j] ? v[j] : a[j];
  return Eigen::internal::pload<Packet>(a);
}

inline Scalar dot(const Scalar* x, const Scalar* y, int64_t n) {
  Packet acc = Eigen::internal::pset1<Packet>(0.0f);
  packets(n, [&](int64_t i, int64_t l) {
    acc = Eigen::internal::pmadd(load_upto(x + i, l), load_upto(y + i, l), acc);
  });
  return eigen::sum(acc);
}

inline Scalar sum(const Scalar* x, int64_t n) {
  Packet acc = Eigen::internal::pset1<Packet>(0.0f);
  packets(n, [&](int64_t i, int64_t l) { acc = Eigen::internal::padd(load_upto(x + i, l), acc); });
  return eigen::sum(acc);
}

inline Scalar max(const Scalar* x, int64_t n) {
  Packet acc = Eigen::internal::pset1<Packet>(-std::numeric_limits<Scalar>::infinity());
  packets(n, [&](int64_t i, int64_t l) {
    // lanes past n read 0: keep acc there (a row of negatives must not see 0)
    const Packet v = load_upto(x + i, l);
    acc = l == eigen::kPacketSize ? Eigen::internal::pmax(acc, v) : max_first(acc, v, l);
  });
  return eigen::max_of(acc);
}

inline Scalar sum_sq_dev(const Scalar* x, Scalar mu, int64_t n) {
  const Packet pm = Eigen::internal::pset1<Packet>(mu);
  Packet acc = Eigen::internal::pset1<Packet>(0.0f);
  packets(n, [&](int64_t i, int64_t l) {
    Packet dev = Eigen::internal::psub(load_upto(x + i, l), pm);
    if (l < eigen::kPacketSize) dev = zero_after(dev, l);  // lanes past n read 0, whose 0 - mu must not count
    acc = Eigen::internal::pmadd(dev, dev, acc);
  });
  return eigen::sum(acc);
}

// sum_i e^(x_i - m); -inf entries give 0.
inline Scalar sum_exp(const Scalar* x, Scalar m, int64_t n) {
  const Packet pm = Eigen::internal::pset1<Packet>(m);
  Packet acc = Eigen::internal::pset1<Packet>(0.0f);
  packets(n, [&](int64_t i, int64_t l) {
    Packet e = eigen::exp(Eigen::internal::psub(load_upto(x + i, l), pm));
    if (l < eigen::kPacketSize) e = zero_after(e, l);
    acc = Eigen::internal::padd(acc, e);
  });
  return eigen::sum(acc);
}

// y = f(x) elementwise for a packet function f (eigen::exp, ...); y may be x.
template <class F>
inline void map(const Scalar* x, Scalar* y, int64_t n, F&& f) {
  packets(n, [&](int64_t i, int64_t l) { store_upto(y + i, f(load_upto(x + i, l)), l); });
}

inline Scalar exp_scalar(Scalar x) {
  alignas(64) Scalar v[eigen::kNativePacketSize];
  Eigen::internal::pstore(v, eigen::exp(Eigen::internal::pset1<eigen::NativePacket>(x)));
  return v[0];
}

// sum_i x_i^2 over a long array (the gradient norm): four accumulators,
// packet j of every 64 entries into accumulator j (the remainder's packets
// likewise), added as (a0 + a1) + (a2 + a3) before eigen::sum's tree. The
// same order on every width, without dot's one chain of dependent adds.
inline Scalar sum_squares(const Scalar* x, int64_t n) {
  using namespace Eigen::internal;
  constexpr int64_t L = eigen::kPacketSize;
  Packet a[4] = {pset1<Packet>(0.0f), pset1<Packet>(0.0f), pset1<Packet>(0.0f), pset1<Packet>(0.0f)};
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    for (int j = 0; j < 4; ++j) {
      const Packet v = ploadu<Packet>(x + i + j * L);
      a[j] = pmadd(v, v, a[j]);
    }
  }
  for (int j = 0; i < n; i += L, ++j) {
    const Packet v = load_upto(x + i, std::min(L, n - i));
    a[j] = pmadd(v, v, a[j]);
  }
  return eigen::sum(padd(padd(a[0], a[1]), padd(a[2], a[3])));
}

// sum_i (x_i - y_i)^2
inline Scalar dist2(const Scalar* x, const Scalar* y, int64_t n) {
  Packet acc = Eigen::internal::pset1<Packet>(0.0f);
  packets(n, [&](int64_t i, int64_t l) {
    const Packet d = Eigen::internal::psub(load_upto(x + i, l), load_upto(y + i, l));
    acc = Eigen::internal::pmadd(d, d, acc);
  });
  return eigen::sum(acc);
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
