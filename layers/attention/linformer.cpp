#include "tapeformer/layers/attention/linformer.h"

#include <cmath>

#include "tapeformer/core/error.h"

namespace tapeformer {
namespace {

const char* const kNotCausal =
    "model.attention \"linformer\" is not causal: its projections E K and F V mix every position, future ones "
    "included, into every projected key and value, so a language model would see the tokens it predicts (use it "
    "in a model with ModelConfig::causal = false, e.g. examples/linformer_encoder.cpp)";

void check_sharing(const std::string& s) {
  TAPEFORMER_CHECK(s == "headwise" || s == "kv" || s == "none",
                   "model.linformer_sharing must be \"headwise\", \"kv\" or \"none\", got \"", s, "\"");
}

}  // namespace

LinformerAttention::LinformerAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng)
    : ProjectedAttention("LinformerAttention", std::move(pos), cfg.n_embd, cfg.n_head, cfg.dropout),
      n(cfg.block_size),
      k(cfg.option_int("linformer_k")),
      sharing(cfg.option_string("linformer_sharing")) {
  TAPEFORMER_CHECK(!cfg.causal, kNotCausal);
  TAPEFORMER_CHECK(k >= 1, "model.linformer_k must be >= 1, got ", k);
  check_sharing(sharing);
  const PositionalNeeds& needs = positional().needs();
  TAPEFORMER_CHECK(!needs.score_bias && !needs.relative_terms,
                   "LinformerAttention: the positional scheme adds terms per (query, key) pair, and the projected keys "
                   "are mixtures of positions");
  init_projections(cfg.bias, residual_init_std(cfg), rng);
  // E K averages over the sequence: std 1 / sqrt(n) keeps a projected key at a key's scale.
  const float std = 1.0f / std::sqrt(static_cast<float>(n));
  const Shape shape = sharing == "none" ? Shape{n_head, k, n} : Shape{k, n};
  const auto init = [&] {
    Tensor t = Tensor::empty(shape);
    rng.fill_normal(t, 0.0f, std);
    return t;
  };
  E = register_parameter("E", init());
  F = sharing == "kv" ? E : register_parameter("F", init());
}

Var LinformerAttention::project(const Var& P, const Var& x) const {
  const int64_t T = x.dim(2);
  const Var PT = slice(P, P.rank() - 1, 0, T);  // (k, T) or (H, k, T): a shorter sequence is n zero-padded
  return matmul(P.rank() == 3 ? reshape(PT, {1, n_head, k, T}) : PT, x);  // (B, H, k, D)
}

Var LinformerAttention::forward(const Var& x, Rng& rng) const {
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd, "LinformerAttention: input ", x.shape(), " must be (B, T, ",
                   n_embd, ")");
  TAPEFORMER_CHECK(x.dim(1) <= n, "LinformerAttention: ", x.dim(1), " positions exceed the projections' length n = ",
                   n, " (model.block_size)");
  const float p = is_training() ? dropout_p : 0.0f;
  const std::vector<Var> h = heads(x);  // q, k, v (B, H, T, D)
  const PositionalLayer& pos = positional();
  const Var q = pos.rotate(h[0], 0), keys = pos.rotate(h[1], 0);
  AttentionSpec spec;
  spec.causal = false;
  spec.dropout_p = p;
  spec.rng = &rng;
  const Var y = softmax_attention(q, project(E, keys), project(F, h[2]), spec);  // (B, H, T, D)
  return output(y, rng);  // (B, T, C)
}

std::unique_ptr<InferenceState> LinformerAttention::make_state(int64_t, int64_t) const { fail(kNotCausal); }

Var LinformerAttention::forward(const Var&, InferenceState&) const { fail(kNotCausal); }

// ---- the registry entry ---------------------------------------------------------

AttentionKind linformer_attention_kind() {
  AttentionKind kind;
  kind.name = "linformer";
  kind.summary = "Linformer (Wang et al. 2020): keys and values projected along the sequence to model.linformer_k rows; "
                 "not causal, so language models refuse it (an encoder's attention)";
  kind.options = {{"linformer_k", int64_t{32}, "linformer: the projected length k"},
                  {"linformer_sharing", std::string("headwise"),
                   "linformer: \"headwise\" (E, F per layer), \"kv\" (E = F) or \"none\" (per head)"}};
  kind.make = [](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) {
    return std::make_shared<LinformerAttention>(cfg, std::move(pos), rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    const double k = static_cast<double>(cfg.option_int("linformer_k")), n = static_cast<double>(cfg.block_size);
    const std::string sharing = cfg.option_string("linformer_sharing");
    const double projections = sharing == "kv" ? k * n : sharing == "none" ? 2 * cfg.n_head * k * n : 2 * k * n;
    return ProjectedAttention::projection_parameters(cfg) + projections;
  };
  kind.check = [](const ModelConfig& cfg, const PositionalKind& pos) {
    TAPEFORMER_CHECK(!cfg.causal, kNotCausal);
    check_sharing(cfg.option_string("linformer_sharing"));
    TAPEFORMER_CHECK(cfg.option_int("linformer_k") >= 1, "model.linformer_k must be >= 1, got ",
                     cfg.option_int("linformer_k"));
    refuse_pair_terms(pos, PairTerms::scores, "linformer",
                      "its terms are per (query, key) pair, and linformer's keys are mixtures of positions");
  };
  kind.causality = Causality::bidirectional;
  return kind;
}

}  // namespace tapeformer
