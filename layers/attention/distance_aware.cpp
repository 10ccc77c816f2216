#include "tapeformer/layers/attention/distance_aware.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/softmax.h"

namespace tapeformer {

namespace {

constexpr Scalar kMaxBeta = 20.0f;  // c = 1 + e^beta stays a float

// sigma(z), without overflow for either sign.
Scalar sigmoid(Scalar z) {
  if (z >= 0) return 1.0f / (1.0f + std::exp(-z));
  const Scalar e = std::exp(z);
  return e / (1.0f + e);
}

}  // namespace

DistanceWeight::DistanceWeight(const Tensor& weighting, bool relu, int64_t n)
    : H_(weighting.rank() == 2 ? weighting.dim(1) : 0), n_(n), relu_(relu) {
  TAPEFORMER_CHECK(weighting.rank() == 2 && weighting.dim(0) == 2, "DistanceWeight: the weighting ",
                   weighting.shape(), " must be (2, H): alpha and beta per head");
  const Tensor w = weighting.contiguous();
  const auto size = static_cast<size_t>(H_ * n_);
  f_.resize(size);
  df_dalpha_.resize(size);
  df_dbeta_.resize(size);
  for (int64_t h = 0; h < H_; ++h) {
    const Scalar alpha = w.data()[h], beta = std::min(w.data()[H_ + h], kMaxBeta);
    const Scalar e_beta = std::exp(beta), c = 1.0f + e_beta;
    for (int64_t d = 0; d < n_; ++d) {
      const auto R = static_cast<Scalar>(d);
      const Scalar sig = sigmoid(alpha * R - beta), f = c * sig;
      const auto at = static_cast<size_t>(h * n_ + d);
      f_[at] = f;
      df_dalpha_[at] = f * (1.0f - sig) * R;
      df_dbeta_[at] = sig * (e_beta - c * (1.0f - sig));
    }
  }
}

void DistanceWeight::check(int64_t, int64_t H, int64_t, int64_t Tk) const {
  TAPEFORMER_CHECK(H_ == H, "DistanceWeight: the weighting (2, ", H_, ") must have the ", H, " heads of q");
  TAPEFORMER_CHECK(Tk <= n_, "DistanceWeight: its tables hold distances below ", n_, ", but ", Tk, " keys need ",
                   Tk - 1);
}

void DistanceWeight::apply(const kernels::ScoreRow& r, Scalar* s) const {
  const Scalar* f = f_.data() + r.h * n_;
  const int64_t base = r.offset() + r.i - r.j0;  // the signed distance of key j0
  for (int64_t x = 0; x < r.n; ++x) {
    const Scalar w = f[std::llabs(base - x * r.step)];
    s[x] = (relu_ ? std::max(s[x], 0.0f) : s[x]) * w;
  }
}

void DistanceWeight::backward(const kernels::ScoreRow& r, const Scalar* in, Scalar* ds, Scalar* part) const {
  const Scalar *f = f_.data() + r.h * n_, *fa = df_dalpha_.data() + r.h * n_, *fb = df_dbeta_.data() + r.h * n_;
  const int64_t base = r.offset() + r.i - r.j0;
  for (int64_t x = 0; x < r.n; ++x) {
    if (!std::isfinite(in[x])) continue;  // a hidden pair: the kernel zeroes its ds
    const int64_t R = std::llabs(base - x * r.step);
    const Scalar s = relu_ ? std::max(in[x], 0.0f) : in[x];
    const Scalar g = ds[x];
    if (part != nullptr) {  // (null in the kernel's pass that does not collect the parameters' gradient)
      part[0] += g * s * fa[R];
      part[1] += g * s * fb[R];
    }
    ds[x] = relu_ && in[x] <= 0 ? 0.0f : g * f[R];
  }
}

void DistanceWeight::fold_gradient(int64_t, int64_t h, const Scalar* part, Scalar* grad) const {
  grad[h] += part[0];
  grad[H_ + h] += part[1];
}

Var distance_aware_attention(const Var& q, const Var& k, const Var& v, const Var& weighting, bool relu,
                             AttentionSpec spec) {
  // Queries are the last Tq of Tk positions (or all Tk, bidirectionally): distances stay below Tk.
  spec.maps.push_back({std::make_shared<DistanceWeight>(weighting.value(), relu, k.dim(2)), weighting});
  return softmax_attention(q, k, v, spec);  // (B, H, Tq, D)
}

DistanceAwareAttention::DistanceAwareAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng)
    : ProjectedAttention("DistanceAwareAttention", std::move(pos), cfg.n_embd, cfg.n_head, cfg.dropout),
      relu(cfg.option_bool("da_relu")) {
  init_projections(cfg.bias, residual_init_std(cfg), rng);
  // alpha = linspace(-1, 1, H): local and long-range heads from the start; beta = 0.
  std::vector<Scalar> init(static_cast<size_t>(2 * n_head), 0.0f);
  for (int64_t h = 0; h < n_head && n_head > 1; ++h)
    init[static_cast<size_t>(h)] = -1.0f + 2.0f * static_cast<Scalar>(h) / static_cast<Scalar>(n_head - 1);
  weighting = register_parameter("weighting", Tensor::from({2, n_head}, init));
}

Var DistanceAwareAttention::inner_attention(const Var& q, const Var& k, const Var& v, int64_t q0, int64_t k0,
                                            float p, Rng* rng) const {
  AttentionSpec spec;
  spec.bias = positional().score_bias(n_head, q.dim(2), k.dim(2), q0, k0);
  spec.dropout_p = p;
  spec.rng = rng;
  return distance_aware_attention(q, k, v, weighting, relu, std::move(spec));  // (B, H, Tq, D)
}

bool DistanceAwareAttention::after_optimizer_step(int64_t) {
  Tensor w = weighting.value();
  for (int64_t h = 0; h < n_head; ++h) w.at({1, h}) = std::min(w.at({1, h}), kMaxBeta);
  return false;
}

std::vector<std::pair<std::string, std::vector<double>>> DistanceAwareAttention::own_metrics() const {
  std::vector<double> alpha, beta;
  const Tensor w = weighting.value().contiguous();
  for (int64_t h = 0; h < n_head; ++h) {
    alpha.push_back(w.data()[h]);
    beta.push_back(w.data()[n_head + h]);
  }
  return {{"alpha", alpha}, {"beta", beta}};
}

// ---- the registry entry ---------------------------------------------------------

AttentionKind distance_aware_attention_kind() {
  AttentionKind kind;
  kind.name = "da";
  kind.summary = "DA-Transformer (Wu et al. 2021): each head reweights ReLU(q.k) by a learned sigmoid of the distance "
                 "|i - j|, a score map inside the softmax kernel; alpha, beta logged in metrics.jsonl; generates "
                 "with a KV cache";
  kind.options = {{"da_relu", true, "da: the paper's ReLU on the scores before the distance weighting"}};
  kind.make = [](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) {
    return std::make_shared<DistanceAwareAttention>(cfg, std::move(pos), rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    return ProjectedAttention::projection_parameters(cfg) + 2.0 * static_cast<double>(cfg.n_head);  // + alpha, beta
  };
  kind.check = [](const ModelConfig&, const PositionalKind& pos) {
    refuse_pair_terms(pos, PairTerms::learned, "da",
                      "its learned per-pair terms need the T x T scores, which the fused kernel never forms");
  };
  return kind;
}

}  // namespace tapeformer
