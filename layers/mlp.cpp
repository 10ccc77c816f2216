#include "tapeformer/layers/mlp.h"

#include "tapeformer/core/error.h"

namespace tapeformer {

FeedForward::FeedForward(int64_t n_embd, int64_t hidden, bool bias, float dropout, const std::string& act,
                         float proj_init_std, Rng& rng)
    : activation(activation_kinds().get(act)) {
  fc = register_module("fc", std::make_shared<Linear>(n_embd, hidden, bias, rng));
  proj = register_module("proj", std::make_shared<Linear>(hidden, n_embd, bias, rng, proj_init_std));
  drop = register_module("drop", std::make_shared<Dropout>(dropout));
}

Var FeedForward::forward(const Var& x, Rng& rng) const {
  // proj(act(fc(x))) as one fused op (see feed_forward in autograd/ops.h) where the activation has one.
  if (activation.fused)
    return drop->forward(feed_forward(x, fc->weight, fc->bias, proj->weight, proj->bias, *activation.fused), rng);
  return drop->forward(proj->forward(activation.apply(fc->forward(x))), rng);  // (B, T, C)
}

GatedFeedForward::GatedFeedForward(int64_t n_embd, int64_t hidden, bool bias, float dropout, const std::string& act,
                                   float proj_init_std, Rng& rng)
    : activation(activation_kinds().get(act)) {
  gate = register_module("gate", std::make_shared<Linear>(n_embd, hidden, bias, rng));
  up = register_module("up", std::make_shared<Linear>(n_embd, hidden, bias, rng));
  proj = register_module("proj", std::make_shared<Linear>(hidden, n_embd, bias, rng, proj_init_std));
  drop = register_module("drop", std::make_shared<Dropout>(dropout));
}

Var GatedFeedForward::forward(const Var& x, Rng& rng) const {
  const Var h = mul(activation.apply(gate->forward(x)), up->forward(x));  // (B, T, H)
  return drop->forward(proj->forward(h), rng);                            // (B, T, C)
}

ModelOption mlp_hidden_option() {
  return {"mlp_hidden", int64_t{0},
          "hidden width of the MLP (0: 4 n_embd for standard, 8 n_embd / 3 rounded up to a multiple of 8 for the "
          "gated kinds)"};
}

int64_t mlp_hidden(const ModelConfig& cfg, int64_t fallback) {
  const int64_t h = cfg.option_int("mlp_hidden");
  return h > 0 ? h : fallback;
}

int64_t gated_hidden(int64_t n_embd) { return (8 * n_embd / 3 + 7) / 8 * 8; }

std::shared_ptr<Mlp> make_mlp(const ModelConfig& cfg, Rng& rng) {
  const MlpKind& kind = mlp_kinds().get(cfg.mlp);
  std::shared_ptr<Mlp> mlp = kind.make(cfg, rng);
  // The entry's count is what the memory check and the docs use: it must be the layer's.
  const double counted = kind.parameters(cfg), built = static_cast<double>(mlp->num_parameters());
  TAPEFORMER_CHECK(counted == built, "model.mlp \"", kind.name, "\": its entry counts ", counted,
                   " parameters per layer (MlpKind::parameters) but the layer it builds has ", built);
  return mlp;
}

namespace {

// Each kind's hidden width: model.mlp_hidden, or its default.
int64_t standard_width(const ModelConfig& cfg) { return mlp_hidden(cfg, 4 * cfg.n_embd); }
int64_t gated_width(const ModelConfig& cfg) { return mlp_hidden(cfg, gated_hidden(cfg.n_embd)); }

// A gated kind with a fixed activation (silu for SwiGLU, gelu for GEGLU).
MlpKind gated_kind(const std::string& name, const std::string& activation, const std::string& summary) {
  MlpKind kind;
  kind.name = name;
  kind.summary = summary;
  kind.make = [activation](const ModelConfig& cfg, Rng& rng) -> std::shared_ptr<Mlp> {
    return std::make_shared<GatedFeedForward>(cfg.n_embd, gated_width(cfg), cfg.bias, cfg.dropout, activation,
                                              residual_init_std(cfg), rng);
  };
  kind.options = {mlp_hidden_option()};
  kind.parameters = [](const ModelConfig& cfg) {
    const double C = static_cast<double>(cfg.n_embd), H = static_cast<double>(gated_width(cfg));
    return 3 * C * H + (cfg.bias ? 2 * H + C : 0);  // gate, up [C, H]; proj [H, C]
  };
  return kind;
}

}  // namespace

Registry<MlpKind>& mlp_kinds() {
  MlpKind standard;
  standard.name = "standard";
  standard.summary = "act(x W1 + b1) W2 + b2 (GPT-2), hidden 4C, act = model.activation, fused into one op";
  standard.options = {mlp_hidden_option()};
  standard.reads_activation = true;
  standard.make = [](const ModelConfig& cfg, Rng& rng) -> std::shared_ptr<Mlp> {
    return std::make_shared<FeedForward>(cfg.n_embd, standard_width(cfg), cfg.bias, cfg.dropout, cfg.activation,
                                         residual_init_std(cfg), rng);
  };
  standard.parameters = [](const ModelConfig& cfg) {
    const double C = static_cast<double>(cfg.n_embd), H = static_cast<double>(standard_width(cfg));
    return 2 * C * H + (cfg.bias ? H + C : 0);  // fc [C, H] and proj [H, C]
  };
  static Registry<MlpKind> kinds(
      "model.mlp", {standard, gated_kind("swiglu", "silu", "(silu(x W_g) * x W_u) W2 (Shazeer 2020), hidden 8C/3 (about the "
                                                            "standard MLP's parameters)"),
                    gated_kind("geglu", "gelu", "(gelu(x W_g) * x W_u) W2 (Shazeer 2020), hidden 8C/3")});
  return kinds;
}

}  // namespace tapeformer
