// Random Feature Attention (Peng et al. 2021), the "rfa" attention kind: a
// member of the linear family whose feature map is random Fourier features
// of the unit-normalised queries and keys, with an optional learned forget
// gate on the running sums, which gives a recency bias. Per head:
//
//   q~ = q / |q|,  k~ = k / |k|,  w_f = eps_f / sigma  (eps_f ~ N(0, I_D), sigma (D) learned, f = 1..F)
//   phi(x) = sqrt(1 / F) [sin(w_1 . x), ..., sin(w_F . x), cos(w_1 . x), ..., cos(w_F . x)]    (2F)
//   so that E phi(x) . phi(y) = exp(-|(x - y) / sigma|^2 / 2), a Gaussian kernel of q~ and k~;
//
//   ungated:  S_t = S_(t-1) + phi(k~_t) v_t^T,            z_t = z_(t-1) + phi(k~_t)
//   gated:    S_t = g_t S_(t-1) + (1 - g_t) phi(k~_t) v_t^T,   z_t likewise,   g_t = sigmoid(w_g . x_t + b_g)
//   y_t = phi(q~_t)^T S_t / d~_t,   d~_t = sign(d_t) max(|d_t|, 1e-4),   d_t = phi(q~_t) . z_t
//
// The features are signed, so d_t may be near 0 or negative: it is clamped
// away from 0 (no gradient where clamped). Training runs the recurrence
// chunk by chunk (rfa_scan: 32 steps at a time in matrix products, the state
// kept between chunks, the backward the chunks in reverse), O(T F D) per head;
// generation is the same recurrence one token at a time (RfaState: S, z, O(1)
// in the length).
//
// The random draw eps (H, D, F): in training a fresh one after every
// optimizer step, as the paper does (unless model.rfa_redraw is false), made
// from a seed of the layer's init and the step, and kept as a buffer, so
// every forward of a step (every shard, every finite difference) sees the
// same one and checkpoints hold it; in eval and generation the fixed draw
// the layer makes at init, a buffer too. model.rfa_features = F
// (128), model.rfa_gate (true). sigma is learned as log sigma (0 at init,
// sigma = 1), which keeps it positive: a sigma near 0 would make the
// frequencies w = eps / sigma, and the features' rounding, explode.
// w_g ~ N(0, 0.02) and b_g = 2 (g ~ 0.88, close to the ungated sums).
#pragma once

#include <atomic>
#include <memory>

#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/projected.h"

namespace tapeformer {

inline constexpr Scalar kRfaMinDenominator = 1e-4f;

// phi(x) of x (B, H, T, D) with sigma (H, D) and the draw eps (H, D, F), no
// gradient to eps -> (B, H, T, 2F): the normalisation, the 1 / sigma and the
// projection are ops; sin and cos are rfa_sincos.
Var rfa_features(const Var& x, const Var& sigma, const Tensor& eps);
// p (..., F) -> sqrt(1 / F) [sin p, cos p] (..., 2F); dp = sqrt(1 / F) (g_sin cos p - g_cos sin p).
Var rfa_sincos(const Var& p);
// The causal scan above on features a = phi(q~), b = phi(k~) (B, H, T, C)
// and values v (B, H, T, M) -> (B, H, T, M); g (B, H, T) in (0, 1) the gate
// (undefined: ungated). Every input gets its gradient.
// `clamps`, when given, counts the denominators seen and those clamped.
struct RfaClampCount {
  std::atomic<int64_t> seen{0}, clamped{0};
};
Var rfa_scan(const Var& a, const Var& b, const Var& v, const Var& g = Var(), RfaClampCount* clamps = nullptr);

// Generation state: per (b, h) the running S (C, M) and z (C), and the positions seen.
class RfaState : public InferenceState {
 public:
  RfaState(int64_t batch, int64_t heads, int64_t features, int64_t values);
  std::string name() const override { return "RfaState"; }
  int64_t length() const override { return seen; }
  void reset() override;

  Tensor S, z;  // (B * H, C, M), (B * H, C)
  int64_t batch, seen = 0;
};

class RandomFeatureAttention : public ProjectedAttention {
 public:
  RandomFeatureAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng);
  Var forward(const Var& x, Rng& rng) const override;  // (B, T, C) -> (B, T, C), causal

  // The recurrent form with the fixed draw: O(F D) per token and head.
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const override;
  Var forward(const Var& x, InferenceState& state) const override;

  int64_t n_features;  // F
  bool gated, redraw;
  Var log_sigma;       // (H, D): sigma = e^log_sigma, positive whatever the optimizer does
  Var gate_w, gate_b;  // (C, H), (H): gated only
  Tensor eval_draw;    // (H, D, F), a buffer: eval and generation
  Tensor train_draw;   // (H, D, F), a buffer: training, redrawn after each optimizer step

 protected:
  bool after_optimizer_step(int64_t step) override;  // the next training draw (returns true: a buffer changed)
  // "clamped": the share of denominators clamped in the forwards since the last call (training's
  // batches and the evaluation's), the paper's sign of too few features.
  std::vector<std::pair<std::string, std::vector<double>>> own_metrics() const override;

 private:
  void redraw_features(int64_t step);
  uint64_t draw_seed_ = 0;
  mutable RfaClampCount clamps_;
  Var gate(const Var& x) const;  // x (B, T, C) -> g (B, H, T)
  // q, k (B, H, T, D) at positions q0.. -> their features (B, H, T, 2F) under `draw`.
  std::pair<Var, Var> features(const Var& q, const Var& k, int64_t q0, const Tensor& draw) const;
};

}  // namespace tapeformer
