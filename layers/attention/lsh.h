// LSH attention (Reformer, Kitaev et al. 2020 §2), the "lsh" attention
// kind: shared-QK attention where a query looks only at keys that hash near it.
//
//   k_j = q_j / |q_j|;  per round r: h_r(x) = argmax([x R_r; -x R_r]), R_r (D, n_b / 2) Gaussian
//   rows sorted by (bucket, position); sorted rows in chunks of m attend to their chunk and the one before,
//   by original positions: later keys masked, a query's own key only when it sees nothing else;
//   rounds combined as y = sum_r softmax_r(lse_r) y_r.
//
// model.lsh_buckets = n_b (even, default 8), model.lsh_hashes = rounds (2),
// model.lsh_chunk = m (64). Each round is one softmax_attention over the
// rows gathered into bucket order (autograd/ops.h), whose block mask is the
// chunk pattern and whose PositionMask (below) hides by original position. Rotations are drawn from the step's Rng in training (the
// reversible stack replays it, so its backward rebuilds the same buckets) and
// are fixed per layer in eval (from a seed of the init stream).
// set_hashes changes the rounds an evaluation uses (E3d).
//
// Not strictly causal, as in Reformer: no value after a query's position is
// ever read, but which chunk a query lands in depends on where later tokens
// hash, so an output can move when a later token changes
// (AttentionKind::causality is chunk_dependent). That dependence goes through
// the discrete bucket choice only: the gradient of y_i with respect to every
// later input is exactly zero (tests/layers/test_lsh.cpp), so training
// cannot learn to use it. For generation it keeps the layer inputs of the
// window and re-runs the whole window per step (RerunsWindow), since the
// chunks depend on all of it: each next token comes from the forward over
// the tokens so far.
#pragma once

#include <memory>
#include <string>

#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/input_window.h"
#include "tapeformer/layers/attention/projected.h"
#include "tapeformer/layers/attention/sparse.h"
#include "tapeformer/layers/basic.h"

namespace tapeformer {

// Rows held in another order than their positions (LSH's buckets), as a
// mask of softmax_attention: q_pos (B, H, Tq) and k_pos (B, H, Tk) give each
// row's position; a key after the query's position is hidden, and with
// no_self the key at the query's own position too, unless the query sees
// nothing else: then it takes that key's value, with lse = kFallbackScore
// (Reformer's finite self mask, without its rounding: the pair's score is a
// constant, so v gets a gradient and q, k none). Use with causal = false.
class PositionMask : public kernels::ScoreMask {
 public:
  PositionMask(IndexTensor q_pos, IndexTensor k_pos, bool no_self);
  void check(int64_t B, int64_t H, int64_t Tq, int64_t Tk) const override;  // the positions' shapes
  void apply(const kernels::ScoreRow& r, Scalar* s) const override;
  int64_t fallback(int64_t b, int64_t h, int64_t i) const override;

 private:
  IndexTensor q_pos_, k_pos_;     // (B, H, Tq), (B, H, Tk)
  bool no_self_;
  int64_t heads_ = 0;
  std::vector<int32_t> self_row_;  // (B, H, Tq): the key row at the query's position, or -1
};

class LSHAttention : public RerunsWindow {
 public:
  LSHAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng);
  using RerunsWindow::forward;
  Var forward(const Var& x, Rng& rng) const override;  // (B, T, C) -> (B, T, C)

  void set_hashes(int64_t n);  // rounds used from now on (>= 1)

  int64_t n_buckets, n_hashes, chunk;  // qkv is [C, 2C]: the shared q = k, and v

 private:
  uint64_t eval_seed_;
  TileCache tiles_;  // the chunk pattern's tiles by (length, chunk): E3d changes chunk for evaluation
};

}  // namespace tapeformer
