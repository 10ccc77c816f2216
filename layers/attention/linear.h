// Linear attention (Katharopoulos et al. 2020; docs/math.md#linear-attention), the "linear"
// attention kind: softmax(q k^T) replaced by a kernel sim(q, k) = phi(q) .
// phi(k) >= 0, so that causal attention costs O(T) and is an RNN:
//
//   y_i = phi(q_i)^T S_i / (phi(q_i) . z_i + eps),  S_i = sum_{j<=i} phi(k_j) v_j^T,  z_i = sum_{j<=i} phi(k_j)
//
//   ModelConfig cfg;  cfg.attention = "linear";  cfg.options["feature_map"] = std::string("elu1");
//   LinearAttention attn(cfg, std::make_shared<PositionalLayer>(), rng);
//   Var y = attn.forward(x, rng);                          // (B, T, C) -> (B, T, C)
//   auto state = attn.make_state(/*batch=*/1, /*window=*/-1);   // S, z: O(1) in the length
//
// Feature maps (`model.feature_map`, the table feature_map_kinds() below; a
// program adds its own phi there):
//   "elu1"      phi(x) = elu(x) + 1 (the paper's);
//   "cos"       phi(x) = [x / |x|; 1], so sim = 1 + cos(q, k) (Su 2020), C = D + 1;
//   "efficient" softmax over features for q and over positions for k (Shen
//               et al. 2021), causal with a running per-feature max;
//   "favor"     Performer's FAVOR+ (Choromanski et al. 2020): positive orthogonal random
//               features phi(x) = e^(w_r . x' - |x'|^2 / 2), x' = x / D^(1/4),
//               so phi(q) . phi(k) estimates e^(q . k / sqrt(D)) (softmax
//               attention's kernel, unbiased); m = model.n_features of them
//               (0: round(D ln D)), w = blocks of D orthogonal directions with
//               chi-distributed lengths, redrawn every model.feature_redraw
//               optimizer steps (0, the default: never) from a seed the layer draws at
//               init, and kept as a buffer (so checkpoints hold them). Run by
//               favor_attention on the features' logs, with streaming
//               stabilisers: the generation state is O(m D) like the others.
//               With RoPE, q and k are rotated before their features.
// No 1/sqrt(D) scale (fast-transformers has none); eps = 1e-6 in the
// denominator. With RoPE (Su et al. 2021 §3.3) the features are rotated in the numerator
// only: y_i = (R_i phi(q_i))^T sum_j (R_j phi(k_j)) v_j^T / (phi(q_i) . z_i + eps),
// which keeps the denominator positive. There are no attention probabilities,
// so no attention dropout; the residual dropout stays.
// Schemes that add to the T x T scores (ALiBi, Shaw) are refused: the scores
// never exist.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/projected.h"
#include "tapeformer/core/registry.h"
#include "tapeformer/layers/basic.h"

namespace tapeformer {

// Generation state: per (b, h) the running S (C, M) and z (C) — or, for the
// efficient map, U (C, M), u (C) and the running max m (C) — and the
// positions seen. Its size does not depend on the length.
class LinearAttentionState : public InferenceState {
 public:
  LinearAttentionState(int64_t batch, int64_t heads, int64_t features, int64_t values);
  std::string name() const override { return "LinearAttentionState"; }
  int64_t length() const override { return seen_; }
  void reset() override;

  Tensor S, z;  // (B * H, C, M), (B * H, C): sums (or U, u for the efficient map)
  Tensor m;     // (B * H, C): the efficient map's running max (-inf when empty)
  int64_t batch;
  int64_t seen_ = 0;
};

struct FeatureMapKind;  // below: the table of feature maps

class LinearAttention : public ProjectedAttention {
 public:
  // How a feature map runs: phi on q and k, then the causal sums (elu1, cos,
  // a program's own); or one of the two maps with algorithms of their own.
  enum class FeatureMap { Features, Efficient, Favor };
  static constexpr float kEps = 1e-6f;

  // Reads n_embd, n_head, bias, dropout (residual only) and model.feature_map.
  LinearAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng);
  Var forward(const Var& x, Rng& rng) const override;  // (B, T, C) -> (B, T, C)

  // The recurrent (RNN) form: O(C M) per token and head, whatever the length.
  // Equals forward()'s rows to float rounding.
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const override;
  Var forward(const Var& x, InferenceState& state) const override;

  const FeatureMapKind& map;  // model.feature_map's entry in feature_map_kinds() (a registry entry: stable)
  int64_t n_features = 0, feature_redraw = 0;  // favor: m, and the steps between redraws
  Tensor omega;                                 // favor: (D, m) random features, a buffer

 private:
  // q or k (B, H, T, D) -> features (B, H, T, C) (elu1, cos).
  Var features(const Var& x) const;
  int64_t feature_dim() const;  // C
  // favor: the log-features w . x' - |x'|^2 / 2 of q or k (B, H, T, D) -> (B, H, T, m).
  Var log_features(const Var& x) const;
  // favor: new random features, from the layer's seed and the redraw count.
  void draw_features(int64_t draw);
  bool after_optimizer_step(int64_t step) override;  // redraws omega every feature_redraw steps
  uint64_t feature_seed_ = 0;
};

// m orthogonal random features in D dimensions (FAVOR+): (D, m), column r a
// direction of a block of D orthonormal ones times the length of a fresh
// D-dim Gaussian vector (so each column is distributed as a Gaussian's).
Tensor orthogonal_random_features(int64_t D, int64_t m, Rng& rng);

// FAVOR+'s feature count for heads of D: `requested` (model.n_features) when
// > 0, else round(D ln D) (at least 1), Performer's default.
int64_t favor_features(int64_t D, int64_t requested);

// The feature maps of linear attention (`model.feature_map`), one table:
//   feature_map_kinds().add({"relu1", "relu(x) + 1", LinearAttention::FeatureMap::Features,
//                            [](const Var& x) { return add_scalar(relu(x), 1.0f); }});
// phi must be positive everywhere (the denominator phi(q_i) . z_i is then
// positive); dim gives its width for heads of D when that is not D.
struct FeatureMapKind {
  std::string name;
  std::string summary;  // one line, for docs
  LinearAttention::FeatureMap algorithm = LinearAttention::FeatureMap::Features;
  std::function<Var(const Var&)> phi;     // Features only
  std::function<int64_t(int64_t D)> dim;  // Features only; null: D
};
Registry<FeatureMapKind>& feature_map_kinds();

}  // namespace tapeformer
