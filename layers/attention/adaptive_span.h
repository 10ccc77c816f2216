// Adaptive attention span (Sukhbaatar et al. 2019), the
// "adaptive_span" attention kind: softmax attention where each head learns
// how far back it looks. Head h has a span z_h = S rho_h (rho_h in [0, 1], a
// parameter initialised to 0 and clamped to [0, 1] after every optimizer
// step) and a soft mask over the distance d = i - j:
//
//   m_h(d) = clamp((R + z_h - d) / R, 0, 1),   a_ij = m(i - j) e^(s_ij) / sum_q m(i - q) e^(s_iq)
//
// computed as the score term log m_h(d) (-inf where m = 0, DistanceTerm
// below) whose gradient the attention kernel returns. Keys no head can reach,
// d >= R + max_h z_h, are not computed at all: the layer runs the window
// pattern of that width, so compute falls as the spans shrink. The loss gets
// lambda S mean_h(rho_h) per layer (Module::auxiliary_loss, a term of the parameters).
//
// model.span_max = S (0: model.block_size), model.span_ramp = R (32),
// model.span_loss = lambda (2e-6). The spans z_h are logged on evaluation
// steps (metrics.jsonl "layers": {"0.attn.spans": [...]}).
#pragma once

#include <memory>
#include <string>

#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/sparse.h"
#include "tapeformer/layers/attention/projected.h"
#include "tapeformer/layers/basic.h"

namespace tapeformer {

// A learned bias by distance as a score term of softmax_attention: query i
// (at position Tk - Tq + i) and key j of head h get table[h, d] at
// d = Tk - Tq + i - j when 0 <= d < n, and -inf otherwise. Its gradient:
//   dtable[h, d] = sum over b and the pairs at distance d of dS_ij
// (a partial per query tile, folded in a fixed order).
class DistanceTerm : public kernels::ScoreTerm {
 public:
  explicit DistanceTerm(const Tensor& table);  // (H, n)
  void check(int64_t B, int64_t H, int64_t Tq, int64_t Tk) const override;  // the table's H
  void add(const kernels::ScoreRow& r, Scalar* sum) const override;
  int64_t partial_size() const override { return n_; }
  void add_gradient(const kernels::ScoreRow& r, const Scalar* ds, Scalar* part) const override;
  void fold_gradient(int64_t b, int64_t h, const Scalar* part, Scalar* grad) const override;

 private:
  Tensor table_;  // (H, n), contiguous
  int64_t n_;
};

// (B, T, C) -> (B, T, C), causal: ProjectedAttention's forwards over
// inner_attention(). Generates with a KVCache of the last `window`
// positions, under the same soft mask by distance.
class AdaptiveSpanAttention : public ProjectedAttention {
 public:
  AdaptiveSpanAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng);

  std::vector<double> spans() const;  // z_h = S rho_h, per head
  // Distances computed over Tk keys: min(Tk, ceil(R + max_h z_h)); farther keys are skipped.
  int64_t reach(int64_t Tk) const;

  int64_t span_max, ramp;
  double span_loss;
  Var rho;  // (H) in [0, 1]

 protected:
  bool after_optimizer_step(int64_t step) override;  // rho clamped to [0, 1] (a parameter: returns false)
  Var own_auxiliary_loss(bool of_batch) const override;  // lambda S mean(rho), not of the batch
  std::vector<std::pair<std::string, std::vector<double>>> own_metrics() const override;  // "spans"

 private:
  // q (B, H, Tq, D) at positions q0.. over k, v (B, H, Tk, D) ending with the queries' positions.
  Var inner_attention(const Var& q, const Var& k, const Var& v, int64_t q0, int64_t k0, float p,
                      Rng* rng) const override;
  TileCache tiles_;  // the window pattern's tiles by (reach, Tq, Tk, q0, k0)
};

}  // namespace tapeformer
