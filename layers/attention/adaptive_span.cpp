#include "tapeformer/layers/attention/adaptive_span.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/softmax.h"
#include "tapeformer/layers/attention/sparse.h"

namespace tapeformer {

DistanceTerm::DistanceTerm(const Tensor& table) : table_(table.contiguous()), n_(table.rank() == 2 ? table.dim(1) : 0) {
  TAPEFORMER_CHECK(table.rank() == 2, "DistanceTerm: the table ", table.shape(), " must be (H, n)");
}

void DistanceTerm::check(int64_t, int64_t H, int64_t, int64_t) const {
  TAPEFORMER_CHECK(table_.dim(0) == H, "DistanceTerm: the table ", table_.shape(), " must be (H, n) with the ", H,
                   " heads of q");
}

void DistanceTerm::add(const kernels::ScoreRow& r, Scalar* sum) const {
  const Scalar* row = table_.data() + r.h * n_;
  const int64_t base = r.offset() + r.i - r.j0;  // the distance of key j0
  for (int64_t x = 0; x < r.n; ++x) {
    const int64_t d = base - x * r.step;
    sum[x] += d >= 0 && d < n_ ? row[d] : -std::numeric_limits<Scalar>::infinity();
  }
}

void DistanceTerm::add_gradient(const kernels::ScoreRow& r, const Scalar* ds, Scalar* part) const {
  const int64_t base = r.offset() + r.i - r.j0;
  for (int64_t x = 0; x < r.n; ++x) {
    const int64_t d = base - x * r.step;
    if (d >= 0 && d < n_) part[d] += ds[x];
  }
}

void DistanceTerm::fold_gradient(int64_t, int64_t h, const Scalar* part, Scalar* grad) const {
  for (int64_t d = 0; d < n_; ++d) grad[h * n_ + d] += part[d];
}

AdaptiveSpanAttention::AdaptiveSpanAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng)
    : ProjectedAttention("AdaptiveSpanAttention", std::move(pos), cfg.n_embd, cfg.n_head, cfg.dropout),
      span_max(cfg.option_int("span_max") > 0 ? cfg.option_int("span_max") : cfg.block_size),
      ramp(cfg.option_int("span_ramp")),
      span_loss(cfg.option_number("span_loss")) {
  TAPEFORMER_CHECK(ramp >= 1 && span_max >= 1 && span_loss >= 0,
                   "model.span_ramp and model.span_max must be >= 1 and model.span_loss >= 0");
  init_projections(cfg.bias, residual_init_std(cfg), rng);
  rho = register_parameter("rho", Tensor::zeros({n_head}));  // spans start at 0: only the ramp is seen
}

std::vector<double> AdaptiveSpanAttention::spans() const {
  std::vector<double> z;
  for (Scalar r : rho.value().to_vector()) z.push_back(static_cast<double>(r) * static_cast<double>(span_max));
  return z;
}

int64_t AdaptiveSpanAttention::reach(int64_t Tk) const {
  // Distances with m > 0 are d < R + z: no key farther than the widest head reaches is computed.
  const std::vector<double> z = spans();
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(ramp + *std::max_element(z.begin(), z.end()))), 1, Tk);
}

Var AdaptiveSpanAttention::inner_attention(const Var& q, const Var& k, const Var& v, int64_t q0, int64_t k0, float p,
                                           Rng* rng) const {
  const int64_t Tq = q.dim(2), Tk = k.dim(2);
  const int64_t n = reach(Tk);
  std::vector<Scalar> d(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) d[static_cast<size_t>(i)] = static_cast<Scalar>(i);
  // m = clamp((R + S rho - d) / R, 0, 1) as relu(x) - relu(x - 1); log m, -inf where m = 0.
  const Var zh = reshape(mul_scalar(rho, static_cast<float>(span_max)), {n_head, 1});  // (H, 1)
  const Var x = mul_scalar(add_scalar(sub(zh, Var(Tensor::from({1, n}, d))), static_cast<float>(ramp)),
                           1.0f / static_cast<float>(ramp));  // (H, n)
  const Var m = sub(relu(x), relu(add_scalar(x, -1.0f)));
  std::vector<Scalar> positive = m.value().contiguous().to_vector();
  for (Scalar& e : positive) e = e > 0 ? 1.0f : 0.0f;
  const Tensor seen = Tensor::from(m.shape(), positive);  // 1 where m > 0
  const Var log_m = where(seen, log(where(seen, m, Var(Tensor::ones(m.shape())))),
                          Var(Tensor::full(m.shape(), -std::numeric_limits<Scalar>::infinity())));
  const auto tiles = tiles_.get({n, Tq, Tk, q0, k0}, [&] {
    ModelConfig w;
    w.options["window"] = n;
    return tile_pattern(*sparse_pattern_kinds().get("window").make(w), Tq, Tk, q0, k0);
  });
  AttentionSpec spec;
  spec.bias = positional().score_bias(n_head, Tq, Tk, q0, k0);
  spec.terms = {{std::make_shared<DistanceTerm>(log_m.value()), log_m}};
  spec.blocks = tiles;
  spec.dropout_p = p;
  spec.rng = rng;
  return softmax_attention(q, k, v, spec);  // (B, H, Tq, D)
}

bool AdaptiveSpanAttention::after_optimizer_step(int64_t) {
  Tensor r = rho.value();
  for (int64_t h = 0; h < n_head; ++h) r.at({h}) = std::clamp(r.at({h}), 0.0f, 1.0f);
  return false;
}

Var AdaptiveSpanAttention::own_auxiliary_loss(bool of_batch) const {
  if (of_batch || span_loss == 0) return Var();
  return mul_scalar(mean(rho), static_cast<float>(span_loss * static_cast<double>(span_max)));  // lambda S mean(rho)
}

std::vector<std::pair<std::string, std::vector<double>>> AdaptiveSpanAttention::own_metrics() const {
  return {{"spans", spans()}};
}

// ---- the registry entry ---------------------------------------------------------

AttentionKind adaptive_span_attention_kind() {
  AttentionKind kind;
  kind.name = "adaptive_span";
  kind.summary = "softmax attention with a learned soft span per head (Sukhbaatar et al. 2019); keys beyond every head's "
                 "reach are not computed, spans logged in metrics.jsonl; generates with a KV cache";
  kind.options = {{"span_max", int64_t{0}, "adaptive_span: S, the longest span (0: model.block_size)"},
                  {"span_ramp", int64_t{32}, "adaptive_span: R, the soft mask's ramp"},
                  {"span_loss", 2e-6, "adaptive_span: lambda of the loss term lambda S mean(rho)"}};
  kind.make = [](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) {
    return std::make_shared<AdaptiveSpanAttention>(cfg, std::move(pos), rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    return ProjectedAttention::projection_parameters(cfg) + static_cast<double>(cfg.n_head);  // qkv, proj, rho
  };
  kind.check = [](const ModelConfig& cfg, const PositionalKind& pos) {
    refuse_pair_terms(pos, PairTerms::learned, "adaptive_span",
                      "its learned per-pair terms need the T x T scores, which the span's kernel never forms");
    TAPEFORMER_CHECK(cfg.option_int("span_ramp") >= 1 && cfg.option_int("span_max") >= 0 &&
                         cfg.option_number("span_loss") >= 0,
                     "model.span_ramp must be >= 1, model.span_max >= 0 and model.span_loss >= 0");
  };
  return kind;
}

}  // namespace tapeformer
