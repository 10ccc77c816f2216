// DA-Transformer's distance-aware attention (Wu et al. 2021), the "da"
// attention kind: softmax attention whose scores each head reweights by a
// learned function of the distance R_ij = |i - j|,
//
//   x = alpha_h R_ij,   f_h(R) = (1 + e^beta_h) / (1 + e^(beta_h - x)) = c_h sigma(x - beta_h),  c_h = 1 + e^beta_h
//   A_ij = ReLU(q_i . k_j) f_h(R_ij) / sqrt(D),   P = softmax_j(A_ij)  (causal),   y_i = sum_j P_ij v_j
//
// f(0) = 1 always; a head with alpha < 0 decays with distance (a local head),
// one with alpha > 0 grows towards c (a long-range head). alpha starts as
// linspace(-1, 1, H) so the heads begin split between the two, beta at 0.
// The reweighting is a learned ScoreMap of the attention kernel
// (DistanceWeight below): it runs inside the fused kernel, and the kernel's
// backward returns the gradient of (alpha, beta). beta is clamped to at most
// 20 after every optimizer step, where c = 1 + e^beta is still a float.
//
// model.da_relu (true): the paper's ReLU on the scores; false keeps the
// signed scores, so alpha = 0 is plain softmax attention. The per-head alpha
// and beta are logged on evaluation steps (metrics.jsonl "layers":
// {"0.attn.alpha": [...], "0.attn.beta": [...]}).
#pragma once

#include <memory>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/projected.h"

namespace tapeformer {

// s_ij -> ReLU(s_ij) f_h(|i - j|) (or s_ij f_h without the ReLU), with the
// distance from the query's position Tk - Tq + i to key j; (alpha, beta)
// read from `weighting` (2, H): row 0 alpha_h, row 1 beta_h. Gradient:
//   ds_in = ds_out f 1[s > 0],  dalpha_h += ds_out ReLU(s) f (1 - sigma) R,
//   dbeta_h += ds_out ReLU(s) sigma (e^beta - c (1 - sigma)),  sigma = sigma(alpha R - beta).
//
// f and its two partial derivatives depend on (h, R) only: they are tables
// of H x n built once per call (n = Tk, the farthest distance plus one), so
// a score costs a lookup, not an exp.
class DistanceWeight : public kernels::ScoreMap {
 public:
  DistanceWeight(const Tensor& weighting, bool relu, int64_t n);  // (2, H); distances 0 .. n - 1
  void check(int64_t B, int64_t H, int64_t Tq, int64_t Tk) const override;  // the table's H
  void apply(const kernels::ScoreRow& r, Scalar* s) const override;
  void backward(const kernels::ScoreRow& r, const Scalar* in, Scalar* ds, Scalar* part) const override;
  int64_t partial_size() const override { return 2; }
  void fold_gradient(int64_t b, int64_t h, const Scalar* part, Scalar* grad) const override;

 private:
  int64_t H_, n_;
  bool relu_;
  std::vector<Scalar> f_, df_dalpha_, df_dbeta_;  // (H, n): f_h(R), f (1 - sigma) R, sigma (e^beta - c (1 - sigma))
};

// Distance-aware attention of q (B, H, Tq, D) over k, v (B, H, Tk, D), the
// queries the last Tq of the Tk positions, causal; weighting (2, H) as
// DistanceWeight's, learned (its gradient comes from the kernel).
Var distance_aware_attention(const Var& q, const Var& k, const Var& v, const Var& weighting, bool relu,
                             AttentionSpec spec = {});

// (B, T, C) -> (B, T, C), causal: ProjectedAttention's forwards over
// inner_attention(). Generates with a KVCache of the last `window`
// positions; the distances are absolute, so the cached keys keep theirs.
class DistanceAwareAttention : public ProjectedAttention {
 public:
  DistanceAwareAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng);

  bool relu;
  Var weighting;  // (2, H): alpha_h, beta_h

 protected:
  bool after_optimizer_step(int64_t step) override;  // beta clamped to <= 20 (a parameter: returns false)
  std::vector<std::pair<std::string, std::vector<double>>> own_metrics() const override;  // "alpha", "beta"

 private:
  // q (B, H, Tq, D) at positions q0.. over k, v (B, H, Tk, D) at k0..
  Var inner_attention(const Var& q, const Var& k, const Var& v, int64_t q0, int64_t k0, float p,
                      Rng* rng) const override;
};

}  // namespace tapeformer
