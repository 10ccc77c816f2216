// The fixed order in which shard gradients are summed: a binary tree over
// the shard index. A range of n >= 2 shards splits after its first p shards,
// p the largest power of two below n, so
//
//   4 shards: (g0 + g1) + (g2 + g3)        3 shards: (g0 + g1) + g2
//
// Every aligned block of a power-of-two count of shards is a subtree: rank r
// of N ranks with S = 2^j shards each (shards r S ... r S + S - 1) sums its
// own shards first and sends one partial sum, and the ranks' partials
// combine in the top of the same tree, so N ranks x S shards give the bits
// of one process with N S shards, whatever N and S are.
//
//   float* scratch = ...;   // shard_tree::scratch_floats(K, n)
//   bool any = shard_tree::sum(0, K, [&](int64_t k) { return grad_of(k); }, out, n, scratch);
//
// A shard without a gradient (leaf(k) == nullptr) is left out, not added as
// zeros: the sum is that of the others, and none at all leaves `out` as it
// was. A leaf may be `out` itself (shard 0's gradient, summed in place).
#pragma once

#include <algorithm>
#include <cstdint>

#include "tapeformer/core/eigen.h"

namespace tapeformer::shard_tree {

// Where a range of n >= 2 leaves splits: the largest power of two below n.
inline int64_t split(int64_t n) {
  int64_t p = 1;
  while (p * 2 < n) p *= 2;
  return p;
}

// Floats of scratch sum() needs for K leaves of n values: one buffer per level.
inline int64_t scratch_floats(int64_t K, int64_t n) {
  int64_t levels = 0;
  for (int64_t p = 1; p < K; p *= 2) ++levels;
  return levels * n;
}

// Sums leaves [lo, hi) into out (n floats); true when any leaf had values.
template <class Leaf>
bool sum(int64_t lo, int64_t hi, const Leaf& leaf, float* out, int64_t n, float* scratch) {
  const auto into = [&](const float* p, bool have) {  // out = p, or out += p
    if (p == out) return;
    if (have) {
      eigen::array(out, n) += eigen::array(p, n);
    } else {
      std::copy(p, p + n, out);
    }
  };
  if (hi - lo == 1) {
    const float* p = leaf(lo);
    if (p == nullptr) return false;
    into(p, false);
    return true;
  }
  if (hi - lo == 2) {  // out = a + b in one pass: the same adds as a copy and then +=
    const float *a = leaf(lo), *b = leaf(lo + 1);
    if (a != nullptr && b != nullptr && b != out) {
      eigen::array(out, n) = eigen::array(a, n) + eigen::array(b, n);
      return true;
    }
  }
  const int64_t mid = lo + split(hi - lo);
  const bool left = sum(lo, mid, leaf, out, n, scratch);
  if (hi - mid == 1) {  // a single right leaf adds straight from its values
    const float* p = leaf(mid);
    if (p == nullptr) return left;
    into(p, left);
    return true;
  }
  if (!sum(mid, hi, leaf, scratch, n, scratch + n)) return left;
  into(scratch, left);
  return true;
}

}  // namespace tapeformer::shard_tree
