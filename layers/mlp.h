// The position-wise feed-forward sublayer of every block, one table of kinds
// (`model.mlp`), so a block never names the MLP it runs.
//
//   standard  FFN(x) = drop(act(x W1 + b1) W2 + b2)            act: model.activation
//   swiglu    FFN(x) = drop((silu(x W_g) * (x W_u)) W2 + b2)   Shazeer 2020, "GLU Variants Improve Transformer"
//   geglu     FFN(x) = drop((gelu(x W_g) * (x W_u)) W2 + b2)   the same paper
//
// x (B, T, C) -> (B, T, C). The hidden width is model.mlp_hidden, by default
// 4 C for standard and 8 C / 3 rounded up to a multiple of 8 for the gated
// kinds, whose three matrices then hold about the parameters of standard's two.
// Parameter names: "fc.weight", "proj.weight" (standard, nanoGPT's layout);
// "gate.weight", "up.weight", "proj.weight" (gated; biases where model.bias).
//
// A program adds its own kind at start-up (see examples/custom_attention):
//   mlp_kinds().add({"my_mlp", "...", {mlp_hidden_option()}, false, make, parameters});
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/core/registry.h"
#include "tapeformer/layers/activations.h"
#include "tapeformer/layers/basic.h"
#include "tapeformer/layers/model_config.h"

namespace tapeformer {

class Mlp : public Module {
 public:
  virtual Var forward(const Var& x, Rng& rng) const = 0;  // (B, T, C) -> (B, T, C); rng: dropout draws
};

struct MlpKind {
  std::string name;
  std::string summary;               // one line, for errors and docs
  std::vector<ModelOption> options;  // model.* keys it reads (the built-ins: mlp_hidden_option())
  bool reads_activation = false;     // whether model.activation applies to it
  std::function<std::shared_ptr<Mlp>(const ModelConfig&, Rng&)> make;
  std::function<double(const ModelConfig&)> parameters;  // of one layer's MLP
};

// The table of MLP kinds (layers/mlp.cpp): standard, swiglu, geglu.
Registry<MlpKind>& mlp_kinds();

// cfg.mlp's kind, built with the residual init of cfg's depth for its output projection.
// cfg.mlp's layer; Error when its entry's parameter count is not the built layer's.
std::shared_ptr<Mlp> make_mlp(const ModelConfig& cfg, Rng& rng);
// model.mlp_hidden when set, else `fallback` (a kind's default width).
int64_t mlp_hidden(const ModelConfig& cfg, int64_t fallback);
// 8 C / 3 rounded up to a multiple of 8: the gated kinds' default width.
int64_t gated_hidden(int64_t n_embd);
// The option every built-in MLP kind declares: model.mlp_hidden.
ModelOption mlp_hidden_option();

// The standard MLP: FFN(x) = drop(act(x W1 + b1) W2 + b2); one fused op when
// the activation has a fused form, composed from ops otherwise.
class FeedForward : public Mlp {
 public:
  // activation: a name in activation_kinds() (layers/activations.h).
  FeedForward(int64_t n_embd, int64_t hidden, bool bias, float dropout, const std::string& activation,
              float proj_init_std, Rng& rng);
  Var forward(const Var& x, Rng& rng) const override;  // (B, T, C) -> (B, T, C)
  const ActivationKind& activation;
  std::shared_ptr<Linear> fc, proj;
  std::shared_ptr<Dropout> drop;
};

// A gated linear unit: FFN(x) = drop((act(x W_g + b_g) * (x W_u + b_u)) W2 + b2).
class GatedFeedForward : public Mlp {
 public:
  GatedFeedForward(int64_t n_embd, int64_t hidden, bool bias, float dropout, const std::string& activation,
                   float proj_init_std, Rng& rng);
  Var forward(const Var& x, Rng& rng) const override;  // (B, T, C) -> (B, T, C)
  const ActivationKind& activation;
  std::shared_ptr<Linear> gate, up, proj;  // [C, H], [C, H], [H, C]
  std::shared_ptr<Dropout> drop;
};

}  // namespace tapeformer
