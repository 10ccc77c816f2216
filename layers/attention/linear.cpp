#include "tapeformer/layers/attention/linear.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>


#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/favor.h"
#include "tapeformer/core/kernels/linear_attention.h"

namespace tapeformer {

Registry<FeatureMapKind>& feature_map_kinds() {
  using Map = LinearAttention::FeatureMap;
  static Registry<FeatureMapKind> kinds(
      "model.feature_map",
      {{"elu1", "phi(x) = elu(x) + 1 (Katharopoulos et al. 2020)", Map::Features,
        [](const Var& x) { return add_scalar(elu(x), 1.0f); },  // > 0 everywhere
        nullptr},
       {"cos", "phi(x) = [x / |x|; 1]: sim = 1 + cos(q, k) (Su 2020)", Map::Features,
        [](const Var& x) {
          // The constant comes last so RoPE's pairs rotate only real features.
          const Var norm = add_scalar(sqrt(sum(mul(x, x), {-1}, true)), 1e-6f);  // (B, H, T, 1)
          const Var ones(Tensor::ones({x.dim(0), x.dim(1), x.dim(2), 1}));
          return concat({div(x, norm), ones}, -1);  // (B, H, T, D + 1)
        },
        [](int64_t D) { return D + 1; }},
       {"efficient", "softmax over features for q, over positions for k, running max (Shen et al. 2021)",
        Map::Efficient, nullptr, nullptr},
       {"favor", "Performer's FAVOR+ positive orthogonal random features (Choromanski et al. 2020)", Map::Favor,
        nullptr, nullptr}});
  return kinds;
}

int64_t favor_features(int64_t D, int64_t requested) {
  if (requested > 0) return requested;
  return std::max<int64_t>(1, std::llround(static_cast<double>(D) * std::log(static_cast<double>(std::max<int64_t>(D, 2)))));
}

Tensor orthogonal_random_features(int64_t D, int64_t m, Rng& rng) {
  Tensor w = Tensor::empty({D, m});  // (D, m)
  std::vector<double> g(static_cast<size_t>(D * D)), q(static_cast<size_t>(D * D));  // column c at c * D
  for (int64_t c0 = 0; c0 < m; c0 += D) {
    for (int64_t i = 0; i < D; ++i)
      for (int64_t j = 0; j < D; ++j) g[j * D + i] = rng.normal();
    // Q of g = QR by modified Gram-Schmidt, in double and plain loops (the
    // same bits on every machine; Eigen's QR vectorises by the CPU). R's
    // diagonal comes out positive, so Q is Haar-distributed: each column
    // uniform on the sphere (a Householder Q needs its signs fixed for that).
    for (int64_t c = 0; c < D; ++c) {
      double* v = q.data() + c * D;
      std::copy_n(g.data() + c * D, D, v);
      for (int64_t p = 0; p < c; ++p) {
        const double* u = q.data() + p * D;
        double r = 0;
        for (int64_t i = 0; i < D; ++i) r += u[i] * v[i];
        for (int64_t i = 0; i < D; ++i) v[i] -= r * u[i];
      }
      double len2 = 0;
      for (int64_t i = 0; i < D; ++i) len2 += v[i] * v[i];
      const double inv = 1.0 / std::sqrt(len2);
      for (int64_t i = 0; i < D; ++i) v[i] *= inv;
    }
    for (int64_t c = c0; c < std::min(m, c0 + D); ++c) {
      float len2 = 0;  // |fresh Gaussian|: chi with D degrees of freedom
      for (int64_t i = 0; i < D; ++i) {
        const float x = rng.normal();
        len2 += x * x;
      }
      for (int64_t i = 0; i < D; ++i) w.at({i, c}) = static_cast<Scalar>(q[(c - c0) * D + i]) * std::sqrt(len2);
    }
  }
  return w;
}

// ---- LinearAttentionState -----------------------------------------------------

LinearAttentionState::LinearAttentionState(int64_t batch_, int64_t heads, int64_t features, int64_t values)
    : S(Tensor::zeros({batch_ * heads, features, values})),
      z(Tensor::zeros({batch_ * heads, features})),
      m(Tensor::full({batch_ * heads, features}, -std::numeric_limits<Scalar>::infinity())),
      batch(batch_) {}

void LinearAttentionState::reset() {
  S.fill(0.0f);
  z.fill(0.0f);
  m.fill(-std::numeric_limits<Scalar>::infinity());
  seen_ = 0;
}

// ---- LinearAttention ----------------------------------------------------------

LinearAttention::LinearAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng)
    : ProjectedAttention("LinearAttention", std::move(pos), cfg.n_embd, cfg.n_head, cfg.dropout),
      map(feature_map_kinds().get(cfg.option_string("feature_map"))) {
  TAPEFORMER_CHECK(map.algorithm != FeatureMap::Features || map.phi != nullptr, "model.feature_map \"", map.name,
                   "\" has no phi");
  if (map.algorithm == FeatureMap::Favor) {
    const int64_t D = cfg.n_embd / std::max<int64_t>(1, cfg.n_head);
    n_features = favor_features(D, cfg.option_int("n_features"));
    feature_redraw = cfg.option_int("feature_redraw");
    feature_seed_ = rng.next_u64();  // the init stream: a replica or a resumed model draws the same
    omega = register_buffer("omega", Tensor::zeros({D, n_features}));
    draw_features(0);
  }
  TAPEFORMER_CHECK(!(positional().needs().score_bias || positional().needs().relative_terms),
                   "LinearAttention: its positional layer adds terms to the T x T scores, which linear attention "
                   "never forms");
  init_projections(cfg.bias, residual_init_std(cfg), rng);
}

int64_t LinearAttention::feature_dim() const {
  const int64_t D = n_embd / n_head;
  if (map.algorithm == FeatureMap::Favor) return n_features;
  return map.algorithm == FeatureMap::Features && map.dim ? map.dim(D) : D;
}

void LinearAttention::draw_features(int64_t draw) {
  Rng rng(feature_seed_ ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(draw + 1)));
  omega.copy_from(orthogonal_random_features(n_embd / n_head, n_features, rng));
}

bool LinearAttention::after_optimizer_step(int64_t step) {
  if (map.algorithm != FeatureMap::Favor || feature_redraw <= 0 || step % feature_redraw != 0) return false;
  draw_features(step / feature_redraw);
  return true;
}

Var LinearAttention::log_features(const Var& x) const {
  const float s = std::pow(static_cast<float>(x.dim(3)), -0.25f);
  const Var xs = mul_scalar(x, s);                                                        // x' = x / D^(1/4)
  return sub(matmul(xs, Var(omega)), mul_scalar(sum(mul(xs, xs), {-1}, true), 0.5f));  // (B, H, T, m)
}

Var LinearAttention::features(const Var& x) const { return map.phi(x); }  // (B, H, T, D) -> (B, H, T, C)

Var LinearAttention::forward(const Var& x, Rng& rng) const {
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd, "LinearAttention: input ", x.shape(), " must be (B, T, ",
                   n_embd, ")");
  const std::vector<Var> h = heads(x);  // q, k, v (B, H, T, D)
  const Var &q = h[0], &k = h[1], &v = h[2];
  Var y;                                                        // (B, H, T, D)
  if (map.algorithm == FeatureMap::Efficient) {
    y = efficient_attention(q, k, v, /*causal=*/true);
  } else if (map.algorithm == FeatureMap::Favor) {
    // RoPE turns q and k themselves: the features then estimate e^(R_i q . R_j k / sqrt(D)).
    const PositionalLayer& pos = positional();
    y = favor_attention(log_features(pos.rotate(q, 0)), log_features(pos.rotate(k, 0)), v);
  } else {
    const Var a = features(q), b = features(k);  // (B, H, T, C)
    const PositionalLayer& pos = positional();
    if (pos.needs().rotates_qk) {
      // RoPE rotates the numerator's features only; the denominator a_i . z_i stays positive.
      const Var num = causal_product(pos.rotate(a, 0), pos.rotate(b, 0), v);               // (B, H, T, D)
      const Var den = add_scalar(sum(mul(a, cumsum(b, 2)), {-1}, /*keepdim=*/true), kEps);  // (B, H, T, 1)
      y = div(num, den);
    } else {
      y = linear_attention(a, b, v, /*causal=*/true, kEps);
    }
  }
  return output(y, rng);  // (B, T, C)
}

std::unique_ptr<InferenceState> LinearAttention::make_state(int64_t batch, int64_t /*window*/) const {
  TAPEFORMER_CHECK(batch >= 1, "LinearAttention: batch size must be >= 1, got ", batch);
  return std::make_unique<LinearAttentionState>(batch, n_head, feature_dim(), n_embd / n_head);
}

Var LinearAttention::forward(const Var& x, InferenceState& state) const {
  check_inference(x);
  LinearAttentionState& s = state_as<LinearAttentionState>(state, "LinearAttention", "LinearAttentionState");
  TAPEFORMER_CHECK(x.dim(0) == s.batch, "LinearAttention: input ", x.shape(), " has batch ", x.dim(0),
                   " but the state was made for ", s.batch);
  const std::vector<Var> h = heads(x);  // q, k, v (B, H, T, D)
  const Var &q = h[0], &k = h[1], &v = h[2];
  const int64_t B = x.dim(0), T = x.dim(1), D = n_embd / n_head, BH = B * n_head, C = feature_dim();
  const int64_t q0 = s.length();  // absolute position of x's first row
  const Tensor vc = v.value().contiguous();  // (B * H, T, D)
  Tensor y = Tensor::empty({B, n_head, T, D});  // (B, H, T, D)
  if (map.algorithm == FeatureMap::Efficient) {
    const Tensor qc = q.value().contiguous(), kc = k.value().contiguous();
    kernels::efficient_attention_recurrent(s.S.data(), s.z.data(), s.m.data(), qc.data(), kc.data(), vc.data(),
                                           y.data(), BH, T, D, D);
  } else if (map.algorithm == FeatureMap::Favor) {
    const PositionalLayer& pos = positional();
    const Tensor a = log_features(pos.rotate(q, q0)).value().contiguous();  // (B, H, T, m)
    const Tensor b = log_features(pos.rotate(k, q0)).value().contiguous();
    kernels::favor_scan(s.S.data(), s.z.data(), s.m.data(), a.data(), b.data(), vc.data(), y.data(), nullptr,
                        kernels::FavorShape{BH, T, C, D});
  } else {
    const Var a = features(q), b = features(k);  // (B, H, T, C)
    const PositionalLayer& pos = positional();
    const Tensor an = pos.rotate(a, q0).value().contiguous(), bn = pos.rotate(b, q0).value().contiguous();
    const Tensor ad = a.value().contiguous(), bd = b.value().contiguous();
    kernels::linear_attention_recurrent(s.S.data(), s.z.data(), an.data(), bn.data(), ad.data(), bd.data(),
                                        vc.data(), y.data(), BH, T, C, D, kEps);
  }
  s.seen_ += T;
  return output(Var(y));  // (B, T, C)
}

// ---- the registry entry ---------------------------------------------------------

AttentionKind linear_attention_kind() {
  AttentionKind kind;
  kind.name = "linear";
  kind.summary = "kernelised linear attention phi(q_i)^T S_i / (phi(q_i) . z_i + eps) (Katharopoulos et al. 2020), a chunked "
                 "O(T) kernel with a hand-written backward; an RNN when generating (running sums S, z)";
  kind.options = {{"feature_map", std::string("elu1"),
                   "linear attention's feature map, a name in model.feature_map's table: \"elu1\" (elu + 1), \"cos\" "
                   "(1 + cos, Su), \"efficient\" (softmax over features for q and over positions for k, Shen et al.), "
                   "\"favor\" (Performer) or a program's own"},
                  {"n_features", int64_t{0}, "favor: random features m (0: round(D ln D))"},
                  {"feature_redraw", int64_t{0},
                   "favor: optimizer steps between redraws of the features (0, the default: never; a redraw costs a "
                   "trained model dearly, docs/results.md)"}};
  kind.make = [](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) {
    return std::make_shared<LinearAttention>(cfg, std::move(pos), rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    return ProjectedAttention::projection_parameters(cfg);
  };
  kind.check = [](const ModelConfig& cfg, const PositionalKind& pos) {
    const LinearAttention::FeatureMap map = feature_map_kinds().get(cfg.option_string("feature_map")).algorithm;
    const char* why = pos.needs.score_bias       ? "it adds constant terms to the T x T attention scores"
                      : pos.needs.relative_terms ? "it adds learned terms per (query, key) pair to the scores and values"
                                                 : nullptr;
    if (why != nullptr) {
      std::string ok;
      for (const PositionalKind& p : positional_kinds().kinds())
        if (!p.needs.score_bias && !p.needs.relative_terms) ok += (ok.empty() ? "" : ", ") + p.name;
      fail("model.positional \"", pos.name, "\" does not combine with model.attention \"linear\": ", why,
           ", which linear attention never forms (schemes that combine with it: ", ok, ")");
    }
    TAPEFORMER_CHECK(!(pos.needs.rotates_qk && map == LinearAttention::FeatureMap::Efficient),
                     "model.positional \"", pos.name,
                     "\" does not combine with model.feature_map \"efficient\": rotating q and k inside its two "
                     "softmaxes is not a rotation of a kernel's features (use elu1 or cos with it)");
    TAPEFORMER_CHECK(cfg.option_int("n_features") >= 0 && cfg.option_int("feature_redraw") >= 0,
                     "model.n_features and model.feature_redraw must be >= 0");
    // Only FAVOR+ draws random features: for another map these keys would be ignored.
    if (map != LinearAttention::FeatureMap::Favor)
      for (const char* key : {"n_features", "feature_redraw"})
        TAPEFORMER_CHECK(cfg.option_int(key) == 0, "model.", key, " = ", cfg.option_int(key),
                         " applies to model.feature_map \"favor\" only (random features); this config selects "
                         "model.feature_map \"", cfg.option_string("feature_map"), "\"");
  };
  return kind;
}

}  // namespace tapeformer
