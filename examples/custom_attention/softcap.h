// A softmax attention kind with a score modifier of its own, written outside
// the library: Gemma 2's soft cap on the attention logits (Gemma Team 2024),
//
//   s_ij = c tanh( (q_i . k_j / sqrt(D) + b_ij) / c ),   c = model.softcap
//
// (b_ij: the positional scheme's score terms, e.g. ALiBi's). The cap is a
// ScoreMap: the library's attention kernel applies it to each row of scores
// in its tiles, forward and in the backward's recompute, and takes dS back
// through it, ds_in = ds_out (1 - tanh^2(s / c)). Nothing else is needed for
// the fast kernel, the KV cache and gradient checking to work: the kind is
// the standard projections (ProjectedAttention) around one softmax_attention.
#pragma once

#include <cmath>
#include <memory>
#include <vector>

#include <tapeformer/autograd/ops.h>
#include <tapeformer/core/error.h>
#include <tapeformer/core/kernels/score_mods.h>
#include <tapeformer/layers/attention/projected.h>
#include <tapeformer/layers/attention/softmax.h>

namespace softcap {

using namespace tapeformer;

// s <- c tanh(s / c), for each score of a row.
class SoftCap : public kernels::ScoreMap {
 public:
  explicit SoftCap(Scalar cap) : cap_(cap) {}
  void apply(const kernels::ScoreRow& r, Scalar* s) const override {
    for (int64_t x = 0; x < r.n; ++x) s[x] = cap_ * std::tanh(s[x] / cap_);
  }
  void backward(const kernels::ScoreRow& r, const Scalar* in, Scalar* ds, Scalar*) const override {
    for (int64_t x = 0; x < r.n; ++x) {
      const Scalar t = std::tanh(in[x] / cap_);
      ds[x] *= 1 - t * t;
    }
  }

 private:
  Scalar cap_;
};

// Multi-head attention with capped scores; generates with a KV cache.
class SoftCapAttention : public ProjectedAttention {
 public:
  SoftCapAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng)
      : ProjectedAttention("SoftCapAttention", std::move(pos), cfg.n_embd, cfg.n_head, cfg.dropout),
        cap_(std::make_shared<SoftCap>(static_cast<Scalar>(cfg.option_number("softcap")))) {
    TAPEFORMER_CHECK(cfg.option_number("softcap") > 0, "model.softcap must be > 0, got ", cfg.option_number("softcap"));
    init_projections(cfg.bias, residual_init_std(cfg), rng);
  }

  Var forward(const Var& x, Rng& rng) const override {  // (B, T, C) -> (B, T, C)
    const std::vector<Var> h = heads(x);                // q, k, v (B, H, T, D)
    const PositionalLayer& pos = positional();
    return output(attend(pos.rotate(h[0], 0), pos.rotate(h[1], 0), h[2], 0, 0, live_dropout(), &rng), rng);
  }

  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const override {
    return std::make_unique<KVCache>(batch, n_head, n_embd / n_head, window);
  }
  Var forward(const Var& x, InferenceState& state) const override {
    check_inference(x);
    KVCache& cache = state_as<KVCache>(state, "SoftCapAttention", "KVCache");
    const int64_t q0 = cache.length();
    const std::vector<Var> h = heads(x);  // (B, H, T, D)
    const PositionalLayer& pos = positional();
    const KVCache::Window w = cache.append(pos.rotate(h[1], q0).value(), h[2].value());  // (B, H, held, D)
    return output(attend(pos.rotate(h[0], q0), Var(w.k), Var(w.v), q0, w.start, 0.0f, nullptr));
  }

 private:
  // q (B, H, Tq, D) at positions q0.. over k, v (B, H, Tk, D) at k0.., causal.
  Var attend(const Var& q, const Var& k, const Var& v, int64_t q0, int64_t k0, float p, Rng* rng) const {
    AttentionSpec spec;
    spec.bias = positional().score_bias(n_head, q.dim(2), k.dim(2), q0, k0);
    spec.maps = {{cap_}};
    spec.dropout_p = p;
    spec.rng = rng;
    return softmax_attention(q, k, v, spec);  // (B, H, Tq, D)
  }

  std::shared_ptr<const SoftCap> cap_;
};

inline AttentionKind softcap_attention_kind() {
  AttentionKind kind;
  kind.name = "softcap";
  kind.summary = "softmax attention with Gemma 2's soft cap c tanh(s / c) on the scores, a score modifier in the "
                 "library's kernel (examples/custom_attention)";
  kind.options = {{"softcap", 30.0, "softcap: the cap c on the attention scores"}};
  kind.make = [](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) -> std::shared_ptr<Attention> {
    return std::make_shared<SoftCapAttention>(cfg, std::move(pos), rng);
  };
  kind.parameters = [](const ModelConfig& cfg) { return ProjectedAttention::projection_parameters(cfg); };
  kind.check = [](const ModelConfig&, const PositionalKind& pos) {
    TAPEFORMER_CHECK(!pos.needs.relative_terms, "model.attention \"softcap\" takes no learned per-pair terms (",
                     "model.positional \"", pos.name, "\"): its kernel never forms the T x T scores");
  };
  return kind;
}

}  // namespace softcap
