// "txl": Transformer-XL's relative positions (Dai et al. 2019 §3.3; docs/math.md#relative-positions).
// For query i at absolute position q0 + i and key j at k0 + j, distance
// d = (q0 + i) - (k0 + j) (clamped to model.clamp_len when > 0):
//
//   A_ij = (q_i + u) . k_j + (q_i + v) . r_d,   r_d = R_d W_kR   (per head, before the 1/sqrt(D) scale)
//
// R_d = [sin(d w_k); cos(d w_k)], w_k = 10000^(-2k/C), k < C/2 (concatenated, as
// Transformer-XL's code, not interleaved); W_kR (C, C) is each layer's own
// ("attn.pos.r_net"), u and v (H, D) are shared by the layers ("pos_emb.u",
// "pos_emb.v", as the PyTorch reference). The relative shift is done by
// index: (q + v) against the 2K + 1 rows r_{K..-K} gives (B, H, Tq, 2K + 1),
// and relative_gather picks column K - d for each (i, j) (clamped at K, which
// is what clamp_len means); future keys are masked by the attention. Token
// embeddings get no absolute positions.
//
// model.same_length: every query sees at most the model.mem_len + 1 most
// recent positions, itself included (Transformer-XL's same_length), as a -inf score bias.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/basic.h"
#include "tapeformer/layers/positional/positional.h"

namespace tapeformer {
namespace {

constexpr PositionalNeeds kTxlNeeds{/*rotates_qk=*/false, /*score_bias=*/true, /*relative_terms=*/true};

// R_d for d = K, K-1, ..., -K: (2K + 1, C).
Tensor sinusoids(int64_t K, int64_t C) {
  Tensor r = Tensor::empty({2 * K + 1, C});
  Scalar* out = r.data();
  const int64_t half = C / 2;
  for (int64_t c = 0; c <= 2 * K; ++c) {
    const double d = static_cast<double>(K - c);
    for (int64_t k = 0; k < half; ++k) {
      const double angle = d * std::pow(10000.0, -2.0 * static_cast<double>(k) / static_cast<double>(C));
      out[c * C + k] = static_cast<Scalar>(std::sin(angle));
      out[c * C + half + k] = static_cast<Scalar>(std::cos(angle));
    }
    if (C % 2 == 1) out[c * C + C - 1] = 0;
  }
  return r;
}

class TxlLayer : public PositionalLayer {
 public:
  TxlLayer(int64_t C, int64_t H, int64_t clamp, int64_t window, Var u, Var v, Rng& rng)
      : PositionalLayer(kTxlNeeds), C_(C), H_(H), clamp_(clamp), window_(window), u_(std::move(u)), v_(std::move(v)) {
    Tensor w = Tensor::empty({C, C});
    rng.fill_normal(w, 0.0f, kInitStd);
    r_net = register_parameter("r_net", w);
  }

  Var score_terms(const Var& q, const Var& k, int64_t q0, int64_t k0) const override {
    const int64_t Tq = q.dim(2), Tk = k.dim(2), D = q.dim(3);
    const int64_t far = std::max<int64_t>(0, q0 + Tq - 1 - k0);  // the largest distance
    const int64_t K = clamp_ > 0 ? std::min(clamp_, far) : far;
    const Var r = matmul(Var(sinusoids(K, C_)), r_net);                              // (2K + 1, C)
    const Var rk = permute(reshape(r, {2 * K + 1, H_, D}), {1, 0, 2});               // (H, 2K + 1, D)
    const Var bd = matmul(add(q, reshape(v_, {1, H_, 1, D})), transpose(rk, 1, 2));  // (B, H, Tq, 2K + 1)
    const Var uk = matmul(reshape(u_, {1, H_, 1, D}), transpose(k, 2, 3));           // (B, H, 1, Tk)
    return add(relative_gather(bd, Tk, q0, k0), uk);                                 // (B, H, Tq, Tk)
  }

  std::vector<Tensor> score_bias(int64_t n_head, int64_t Tq, int64_t Tk, int64_t q0, int64_t k0) const override {
    if (window_ <= 0) return {};
    Tensor b = Tensor::zeros({1, 1, Tq, Tk});
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = 0; j < Tk; ++j)
        if ((q0 + i) - (k0 + j) > window_) b.at({0, 0, i, j}) = -std::numeric_limits<Scalar>::infinity();
    return {b};
  }

  Var r_net;  // W_kR, (C, C)

 private:
  int64_t C_, H_, clamp_, window_;
  Var u_, v_;  // the model's, (H, D) each
};

class TxlPositional : public Positional {
 public:
  TxlPositional(const ModelConfig& cfg, Rng& rng)
      : C_(cfg.n_embd),
        H_(cfg.n_head),
        clamp_(cfg.option_int("clamp_len")),
        window_(cfg.option_bool("same_length") ? cfg.option_int("mem_len") : 0) {
    Tensor u0 = Tensor::empty({H_, C_ / H_}), v0 = Tensor::empty(u0.shape());
    rng.fill_normal(u0, 0.0f, kInitStd);
    rng.fill_normal(v0, 0.0f, kInitStd);
    u = register_parameter("u", u0);
    v = register_parameter("v", v0);
  }
  std::shared_ptr<PositionalLayer> make_layer(Rng& rng) const override {
    return std::make_shared<TxlLayer>(C_, H_, clamp_, window_, u, v, rng);
  }
  Var u, v;  // (H, D) each, shared by every layer

 private:
  int64_t C_, H_, clamp_, window_;
};

}  // namespace

PositionalKind txl_positional_kind() {
  PositionalKind kind;
  kind.name = "txl";
  kind.summary = "Transformer-XL's relative positions (Dai et al. 2019): (q_i + u) k_j + (q_i + v) W_kR R_(i-j), sinusoids R "
                 "through a per-layer W_kR, u and v shared (not with linear attention)";
  kind.needs = kTxlNeeds;
  kind.options = {
      {"clamp_len", int64_t{0}, "txl positions: distances above this reuse its encoding (0: no clamp)"},
      {"same_length", false, "txl positions: each query sees at most model.mem_len + 1 positions (itself included)"}};
  kind.make = [](const ModelConfig& cfg, Rng& rng) { return std::make_shared<TxlPositional>(cfg, rng); };
  kind.parameters = [](const ModelConfig& cfg) {
    const double C = static_cast<double>(cfg.n_embd);
    return 2 * C + static_cast<double>(cfg.n_layer) * C * C;  // u, v (H x D = C each); W_kR per layer
  };
  kind.check = [](const ModelConfig& cfg) {
    const int64_t clamp = cfg.option_int("clamp_len");
    TAPEFORMER_CHECK(clamp >= 0 && clamp <= 1 << 20, "model.clamp_len must be in [0, 2^20], got ", clamp);
    TAPEFORMER_CHECK(!cfg.option_bool("same_length") || cfg.option_int("mem_len") > 0,
                     "model.same_length needs a memory: set model.mem_len > 0");
  };
  return kind;
}

}  // namespace tapeformer
