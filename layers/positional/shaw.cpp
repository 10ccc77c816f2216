// "shaw": relative positions with clipping (Shaw et al. 2018 §3). Each
// layer learns 2K + 1 key vectors a^K and value vectors a^V (K =
// model.rel_clip), shared by the heads; for query i and key j with offset
// o = clamp(j - i, -K, K):
//   e_ij = q_i . (k_j + a^K_o) / sqrt(D),  z_i = sum_j alpha_ij (v_j + a^V_o).
// Computed as q a^K^T for the 2K + 1 offsets, gathered by offset, and the
// probabilities summed into 2K + 1 bins times a^V (docs/math.md#positional-schemes).
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/basic.h"
#include "tapeformer/layers/positional/positional.h"

namespace tapeformer {
namespace {

constexpr PositionalNeeds kShawNeeds{/*rotates_qk=*/false, /*score_bias=*/false, /*relative_terms=*/true};

class ShawLayer : public PositionalLayer {
 public:
  ShawLayer(int64_t clip, int64_t head_dim, Rng& rng) : PositionalLayer(kShawNeeds), clip_(clip) {
    Tensor k = Tensor::empty({2 * clip + 1, head_dim}), v = Tensor::empty(k.shape());  // (2K + 1, D)
    rng.fill_normal(k, 0.0f, kInitStd);
    rng.fill_normal(v, 0.0f, kInitStd);
    key = register_parameter("key", k);
    value = register_parameter("value", v);
  }

  Var score_terms(const Var& q, const Var& k, int64_t q0, int64_t k0) const override {
    return relative_gather(matmul(q, transpose(key, 0, 1)), k.dim(2), q0, k0);  // (B, H, Tq, 2K + 1) -> (B, H, Tq, Tk)
  }
  Var value_terms(const Var& p, int64_t q0, int64_t k0) const override {
    return matmul(relative_scatter(p, clip_, q0, k0), value);  // (B, H, Tq, 2K + 1) @ (2K + 1, D)
  }

  Var key, value;  // (2K + 1, D) each; row o + K holds offset o

 private:
  int64_t clip_;
};

class ShawPositional : public Positional {
 public:
  ShawPositional(int64_t clip, int64_t head_dim) : clip_(clip), head_dim_(head_dim) {}
  std::shared_ptr<PositionalLayer> make_layer(Rng& rng) const override {
    return std::make_shared<ShawLayer>(clip_, head_dim_, rng);
  }

 private:
  int64_t clip_, head_dim_;
};

}  // namespace

PositionalKind shaw_positional_kind() {
  PositionalKind kind;
  kind.name = "shaw";
  kind.summary = "learned relative keys and values per offset clipped to model.rel_clip, per layer (Shaw et al. 2018; not "
                 "with linear attention)";
  kind.needs = kShawNeeds;
  kind.options = {
      {"rel_clip", int64_t{16}, "Shaw's positions: offsets are clipped to [-K, K], K = model.rel_clip", int64_t{3}}};
  kind.make = [](const ModelConfig& cfg, Rng&) {
    return std::make_shared<ShawPositional>(cfg.option_int("rel_clip"), cfg.n_embd / cfg.n_head);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    return static_cast<double>(cfg.n_layer) * 2 * static_cast<double>(2 * cfg.option_int("rel_clip") + 1) *
           static_cast<double>(cfg.n_embd / cfg.n_head);
  };
  kind.check = [](const ModelConfig& cfg) {
    const int64_t k = cfg.option_int("rel_clip");
    TAPEFORMER_CHECK(k >= 1 && k <= 1 << 20, "model.rel_clip must be in [1, 2^20], got ", k);
  };
  return kind;
}

}  // namespace tapeformer
