// Score and mask modifiers of the attention kernel (flash_attention.h), the
// idea of PyTorch's FlexAttention (score_mod, mask_mod) for a C++ kernel:
// the kernel computes, for query i and key j of head h of batch row b,
//
//   s_ij = map_m( ... map_1( q_i . k_j / sqrt(D) + sum_t term_t(b, h, i, j) ) ... )
//   s_ij = -inf where a mask hides (b, h, i, j)          P_i = softmax_j(s_ij)
//
// and a kind brings its terms, maps and masks; the kernel has no field and
// no branch for any kind. A modifier works on a row of scores at a time (one
// query against up to one 64-key tile), so it is one virtual call per row,
// never one per score, and its own loop vectorises.
//
//   // Gemma 2's soft cap: s -> c tanh(s / c), c = 50.
//   struct SoftCap : ScoreMap {
//     void apply(const ScoreRow& r, Scalar* s) const override {
//       for (int64_t x = 0; x < r.n; ++x) s[x] = 50 * std::tanh(s[x] / 50);
//     }
//     void backward(const ScoreRow& r, const Scalar* in, Scalar* ds, Scalar*) const override {
//       for (int64_t x = 0; x < r.n; ++x) { const Scalar t = std::tanh(in[x] / 50); ds[x] *= 1 - t * t; }
//     }
//   };
//
// Learned modifiers (adaptive span's bias by distance, a learned cap) get
// their gradient from the kernel's backward: each work item (b, h, query
// tile) sums into a partial of partial_size() floats, and the kernel folds
// the partials into the parameter's gradient in the fixed order b, h, tile,
// so the result does not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "tapeformer/core/storage.h"

namespace tapeformer::kernels {

// Where a row of scores sits, in the coordinates of the attention call: batch
// row b, head h, query i against keys j0, j0 + step, ..., j0 + (n - 1) step
// (step > 1 only for a head group read as residue classes). Queries and keys
// are aligned at the end: query i sits at key position Tk - Tq + i.
struct ScoreRow {
  int64_t b, h, i;
  int64_t j0, step, n;
  int64_t Tq, Tk;
  int64_t key(int64_t x) const { return j0 + x * step; }
  int64_t offset() const { return Tk - Tq; }  // query i's position among the keys is offset() + i
};

// A modifier's learned part (the default: none).
class LearnedModifier {
 public:
  virtual ~LearnedModifier() = default;
  // Throws Error (naming the modifier and the sizes) when it cannot serve an
  // attention of B batch rows, H heads, Tq queries and Tk keys.
  virtual void check(int64_t B, int64_t H, int64_t Tq, int64_t Tk) const {}
  // Floats of one work item's partial gradient; 0: no parameters.
  virtual int64_t partial_size() const { return 0; }
  // grad (the parameter's gradient, its layout) += one (b, h, query tile)'s
  // partial; called for every (b, h, tile) in that order.
  virtual void fold_gradient(int64_t b, int64_t h, const Scalar* part, Scalar* grad) const {}
};

// An additive term t(b, h, i, j), e.g. ALiBi's -m_h (i - j), a -inf padding
// mask, a learned bias by distance. The terms of a call are summed in order,
// then added to the scaled scores, in the forward and in the backward's
// recompute alike (the same bits).
class ScoreTerm : public LearnedModifier {
 public:
  // sum[x] += t(b, h, i, key(x)) for x in [0, r.n).
  virtual void add(const ScoreRow& r, Scalar* sum) const = 0;
  // A learned term: part += dL/dtheta of this row, given ds[x] = dL/ds_{i, key(x)}.
  virtual void add_gradient(const ScoreRow& r, const Scalar* ds, Scalar* part) const {}
};

// A function of the score, s <- f(s, b, h, i, j), after the terms. It sees
// the row's finite scores only: a score that is -inf (hidden by a term, or
// beyond the causal diagonal) stays -inf whatever apply() writes there.
class ScoreMap : public LearnedModifier {
 public:
  // s[x] = f(s[x]) for x in [0, r.n).
  virtual void apply(const ScoreRow& r, Scalar* s) const = 0;
  // ds[x] = dL/d f(s_x) -> dL/d s_x = ds[x] f'(in[x]), in place, where in[x]
  // is the score apply() received; a learned map adds dL/dtheta to part,
  // which is null in the kernel's passes that do not collect it (the
  // key-tile pass of rows longer than one tile).
  // Entries whose input was -inf are zeroed by the kernel afterwards.
  virtual void backward(const ScoreRow& r, const Scalar* in, Scalar* ds, Scalar* part) const = 0;
};

// Which pairs a query sees, beyond the causal mask and the block mask's
// tiles (mask_mod): hidden pairs get -inf scores, exactly zero probability.
class ScoreMask {
 public:
  virtual ~ScoreMask() = default;
  // As LearnedModifier::check.
  virtual void check(int64_t B, int64_t H, int64_t Tq, int64_t Tk) const {}
  // s[x] = -inf where query i may not see key(x), x in [0, r.n).
  virtual void apply(const ScoreRow& r, Scalar* s) const = 0;
  // A query that sees no key at all takes the value of this key row instead,
  // y_i = v_j with lse_i = kFallbackScore (Reformer's rule for a token alone
  // in its bucket); -1, the default: y_i = 0 and lse_i = +inf.
  virtual int64_t fallback(int64_t b, int64_t h, int64_t i) const { return -1; }
};

inline constexpr Scalar kFallbackScore = -1e5f;  // the lse of a query that sees only its fallback key

// A constant term read from a (B, H, Tq, Tk) tensor through its strides,
// stride 0 on broadcast dims (a Tensor::expand view): ALiBi's (1, H, Tq, 1)
// and (1, H, 1, Tk) parts, a key-padding (B, 1, 1, Tk) of 0 / -inf.
class BiasTerm : public ScoreTerm {
 public:
  BiasTerm(const Scalar* data, int64_t sb, int64_t sh, int64_t si, int64_t sj)
      : data_(data), sb_(sb), sh_(sh), si_(si), sj_(sj) {}
  void add(const ScoreRow& r, Scalar* sum) const override;

 private:
  const Scalar* data_;
  int64_t sb_, sh_, si_, sj_;
};

// The modifiers of one call, applied in this order.
struct ScoreMods {
  std::vector<const ScoreTerm*> terms;  // summed in order, then added to the scaled scores
  std::vector<const ScoreMap*> maps;    // then applied in order
  std::vector<const ScoreMask*> masks;  // then -inf where any of them hides the pair
  // For the backward: the learned terms' gradients, then the learned maps',
  // each the layout its fold_gradient writes (null or missing: not wanted).
  std::vector<Scalar*> grads;
  bool empty() const { return terms.empty() && maps.empty() && masks.empty(); }
};

}  // namespace tapeformer::kernels
