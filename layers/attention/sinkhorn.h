// Sparse Sinkhorn attention (Tay et al. 2020), the "sinkhorn" attention
// kind: the sequence is cut into N blocks of b positions; a learned sorting
// network gives each block a soft permutation over the blocks, and each
// block's queries attend to the block sorted into its place plus their own
// block, in one softmax over 2b keys:
//
//   x'_i = [sum of block i's q; sum of block i's k]                       (2D)
//   R = ReLU(x' W_P) (N, N),  L = (log(R + 1e-6) + Gumbel noise in training) / tau
//   S = Sinkhorn(L): k times L <- L - LSE_row(L); L <- L - LSE_col(L); S = e^L  (doubly stochastic)
//   K~_i = sum_j S_ij K_j,  V~_i likewise (b x D each)
//   y (block i) = softmax([q K~_i^T, q K_i^T] / sqrt(D)) [V~_i; V_i]
//
// Causal (language models), where a column step would mix later blocks into
// earlier rows: block i's summary is block i - 1's (complete, so earlier
// than every query of block i), S_ij is hidden for j >= i and rows are
// normalised only (a softmax over the earlier blocks, model.sinkhorn_iters
// unused), block 0 has no sorted part, and the own block is causal. Every
// output then reads only earlier positions.
//
// W_P is (2D, N_max), N_max = ceil(model.block_size / b), shared by the
// heads; a shorter sequence uses its first N columns. Causal, T is padded
// to a multiple of b (the padded keys are later than every query);
// bidirectional, T must be a multiple of b. Generation re-runs the window
// (RerunsWindow), since the sorting of a block depends on the block before;
// the window holds at most the N_max b positions W_P is sized for.
//
// model.sinkhorn_block = b (16), model.sinkhorn_temperature = tau (0.75),
// model.sinkhorn_iters = k (7, bidirectional only).
#pragma once

#include <memory>

#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/input_window.h"
#include "tapeformer/layers/attention/projected.h"

namespace tapeformer {

struct SinkhornOptions {
  int64_t block = 16;   // b
  float tau = 0.75f;    // temperature
  int64_t iters = 7;    // Sinkhorn iterations (bidirectional)
  bool causal = true;
  Rng* gumbel = nullptr;  // Gumbel noise on L from this stream (training); null: none
  float dropout = 0;      // on the attention weights, with `dropout_rng`
  Rng* dropout_rng = nullptr;
};

// q, k, v (B, H, T, D) -> (B, H, T, D) with the sorting network's W_P
// (2D, >= ceil(T / b)); every input but the noise gets its gradient.
Var sinkhorn_attention(const Var& q, const Var& k, const Var& v, const Var& w_p, const SinkhornOptions& o);

class SinkhornAttention : public RerunsWindow {
 public:
  SinkhornAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng);
  using RerunsWindow::forward;
  Var forward(const Var& x, Rng& rng) const override;  // (B, T, C) -> (B, T, C)

  SinkhornOptions options;
  int64_t max_blocks;  // N_max
  Var w_p;             // (2D, N_max)

 protected:
  int64_t rerun_limit() const override { return max_blocks * options.block; }  // N_max b
};

}  // namespace tapeformer
