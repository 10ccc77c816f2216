// Kinds written outside the library, and the stock command line on them:
// `my_tapeformer train | sample | eval | ...` is `tapeformer` with
//   model.attention "sigmoid"  sigmoid attention (Ramapuram et al. 2024):
//                              y_i = sum_{j <= i} sigmoid(q_i . k_j / sqrt(D) + b) v_j,
//                              b = model.sigmoid_bias, no softmax normaliser;
//   model.attention "softcap"  softmax attention with Gemma 2's soft cap c tanh(s / c)
//                              on the scores, c = model.softcap: a score modifier
//                              that runs in the library's attention kernel (softcap.h);
//   model.mlp "relu2"          squared ReLU (So et al. 2021, Primer):
//                              FFN(x) = relu(x W1 + b1)^2 W2 + b2;
//   optimizer.name "lion"      Lion (Chen et al. 2023): c = b1 m + (1 - b1) g,
//                              p -= lr (sign(c) + wd p), m = b2 m + (1 - b2) g;
//   model.arch "char_mlp"      not a Transformer: Bengio et al. 2003's MLP over
//                              the last model.char_mlp_context tokens' embeddings,
//                              logits_t = tanh([e_{t-k+1}; ...; e_t] W1 + b1) W2 + b2.
// Each is one registry entry; its config keys (model.sigmoid_bias,
// model.softcap, optimizer.lion_beta1, optimizer.lion_beta2,
// model.char_mlp_context) are declared with it.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <tapeformer/autograd/ops.h>
#include <tapeformer/cli/cli.h>
#include <tapeformer/layers/attention/attention.h>
#include <tapeformer/layers/language_model.h>
#include <tapeformer/layers/mlp.h>
#include <tapeformer/optim/optimizer.h>
#include <tapeformer/train/build.h>

#include "softcap.h"

using namespace tapeformer;

// ---- attention ---------------------------------------------------------------

// The inputs seen so far, (B, L, C): sampling recomputes the new rows over them.
struct SeenInputs : InferenceState {
  std::string name() const override { return "SeenInputs"; }
  int64_t length() const override { return seen; }
  void reset() override { x = Tensor(), seen = 0; }
  Tensor x;  // (B, L, C), the last `window` positions
  int64_t window = -1, seen = 0;
};

class SigmoidAttention : public Attention {
 public:
  SigmoidAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng)
      : Attention(std::move(pos)), n_head_(cfg.n_head), n_embd_(cfg.n_embd),
        bias_(static_cast<Scalar>(cfg.option_number("sigmoid_bias"))) {
    qkv = register_module("qkv", std::make_shared<Linear>(cfg.n_embd, 3 * cfg.n_embd, cfg.bias, rng));
    proj = register_module("proj", std::make_shared<Linear>(cfg.n_embd, cfg.n_embd, cfg.bias, rng,
                                                            residual_init_std(cfg)));
  }

  Var forward(const Var& x, Rng&) const override { return proj->forward(attend(x, 0)); }

  std::unique_ptr<InferenceState> make_state(int64_t, int64_t window) const override {
    auto s = std::make_unique<SeenInputs>();
    s->window = window;
    return s;
  }
  Var forward(const Var& x, InferenceState& state) const override {
    check_inference("SigmoidAttention", x, n_embd_);
    SeenInputs& s = state_as<SeenInputs>(state, "SigmoidAttention", "SeenInputs");
    const int64_t T = x.value().dim(1);
    s.x = s.x.defined() ? concat({Var(s.x), x}, 1).value() : x.value().contiguous();
    const int64_t L = s.x.dim(1);
    if (s.window >= 0 && L > s.window) s.x = s.x.slice(1, L - s.window, L).contiguous();
    s.seen += T;
    const int64_t kept = s.x.dim(1);
    return proj->forward(attend(Var(s.x), kept - T));  // the rows of x only
  }

  std::shared_ptr<Linear> qkv, proj;

 private:
  // Rows first.. of the causal sigmoid attention over x (B, L, C), heads merged: (B, L - first, C).
  Var attend(const Var& x, int64_t first) const {
    const int64_t L = x.value().dim(1), D = n_embd_ / n_head_;
    const std::vector<Var> qkv_heads = split_heads(qkv->forward(x), n_head_);  // q, k, v: (B, H, L, D)
    const Var q = slice(qkv_heads[0], 2, first, L);
    const Var scores = mul_scalar(matmul(q, transpose(qkv_heads[1], 2, 3)), 1.0f / std::sqrt(float(D)));  // (B, H, L - first, L)
    Tensor future = Tensor::zeros({L - first, L});  // 1 where key j lies after query i
    for (int64_t i = first; i < L; ++i)
      for (int64_t j = i + 1; j < L; ++j) future.data()[(i - first) * L + j] = 1;
    const Var weights = sigmoid(masked_fill(add_scalar(scores, bias_), future, -1e9f));  // 0 on the future
    return merge_heads(matmul(weights, qkv_heads[2]));  // (B, L - first, C)
  }

  int64_t n_head_, n_embd_;
  Scalar bias_;
};

AttentionKind sigmoid_attention_kind() {
  AttentionKind kind;
  kind.name = "sigmoid";
  kind.summary = "causal sigmoid attention, no normaliser (Ramapuram et al. 2024; examples/custom_attention)";
  kind.options = {{"sigmoid_bias", -4.0, "sigmoid attention: the score bias b (about -ln T)"}};
  kind.make = [](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) -> std::shared_ptr<Attention> {
    return std::make_shared<SigmoidAttention>(cfg, std::move(pos), rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    const double C = static_cast<double>(cfg.n_embd);
    return 4 * C * C + (cfg.bias ? 4 * C : 0);  // qkv [C, 3C], proj [C, C]
  };
  kind.check = [](const ModelConfig& cfg, const PositionalKind& pos) {
    TAPEFORMER_CHECK(!pos.needs.rotates_qk && !pos.needs.score_bias && !pos.needs.relative_terms,
                     "model.attention \"sigmoid\" takes positions added to the embeddings (learned, sinusoidal), not "
                     "model.positional \"", pos.name, "\"");
    TAPEFORMER_CHECK(cfg.dropout == 0.0f, "model.attention \"sigmoid\" has no attention dropout: set model.dropout = 0");
  };
  return kind;
}

// ---- MLP -------------------------------------------------------------------------

class SquaredReluMlp : public Mlp {
 public:
  SquaredReluMlp(const ModelConfig& cfg, Rng& rng) {
    const int64_t hidden = mlp_hidden(cfg, 4 * cfg.n_embd);
    fc = register_module("fc", std::make_shared<Linear>(cfg.n_embd, hidden, cfg.bias, rng));
    proj = register_module("proj", std::make_shared<Linear>(hidden, cfg.n_embd, cfg.bias, rng, residual_init_std(cfg)));
  }
  Var forward(const Var& x, Rng&) const override {
    const Var h = relu(fc->forward(x));      // (B, T, H)
    return proj->forward(mul(h, h));         // (B, T, C)
  }
  std::shared_ptr<Linear> fc, proj;
};

MlpKind relu2_mlp_kind() {
  MlpKind kind;
  kind.name = "relu2";
  kind.summary = "relu(x W1 + b1)^2 W2 + b2 (So et al. 2021; examples/custom_attention)";
  kind.options = {mlp_hidden_option()};
  kind.make = [](const ModelConfig& cfg, Rng& rng) -> std::shared_ptr<Mlp> {
    return std::make_shared<SquaredReluMlp>(cfg, rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    const double C = static_cast<double>(cfg.n_embd), H = static_cast<double>(mlp_hidden(cfg, 4 * cfg.n_embd));
    return 2 * C * H + (cfg.bias ? H + C : 0);
  };
  return kind;
}

// ---- optimizer -------------------------------------------------------------

class Lion : public Optimizer {
 public:
  Lion(std::vector<ParamGroup> groups, float beta1, float beta2)
      : Optimizer("Lion", std::move(groups), {"exp_avg"}), beta1_(beta1), beta2_(beta2) {
    TAPEFORMER_CHECK(beta1 >= 0 && beta1 < 1, "Lion: optimizer.lion_beta1 must be in [0, 1), got ", beta1);
    TAPEFORMER_CHECK(beta2 >= 0 && beta2 < 1, "Lion: optimizer.lion_beta2 must be in [0, 1), got ", beta2);
  }

 private:
  void update(const ParamGroup& group, int64_t, const Block& b) const override {
    Scalar* m = b.buffers[0];
    for (int64_t i = 0; i < b.n; ++i) {
      const Scalar g = b.grad[i] * b.grad_scale;
      const Scalar c = beta1_ * m[i] + (1 - beta1_) * g;
      const Scalar sign = static_cast<Scalar>((c > 0) - (c < 0));
      b.param[i] -= group.lr * (sign + group.weight_decay * b.param[i]);
      m[i] = beta2_ * m[i] + (1 - beta2_) * g;
    }
  }
  float beta1_, beta2_;
};

OptimizerKind lion_optimizer_kind() {
  OptimizerKind kind;
  kind.name = "lion";
  kind.summary = "sign of an interpolated momentum (Chen et al. 2023; examples/custom_attention)";
  kind.options = {{"lion_beta1", 0.9, "lion: weight of the momentum in the update's sign"},
                  {"lion_beta2", 0.99, "lion: decay of the momentum it keeps"}};
  kind.make = [](const OptimizerConfig& c, const NamedVars& params) -> std::unique_ptr<Optimizer> {
    return std::make_unique<Lion>(decay_groups(params, static_cast<float>(c.lr), static_cast<float>(c.weight_decay)),
                                  static_cast<float>(c.option_number("lion_beta1")),
                                  static_cast<float>(c.option_number("lion_beta2")));
  };
  return kind;
}

// ---- a language model that is not a Transformer ----------------------------------

// The last k - 1 ids of each row seen so far, (B, <= k - 1): the context of the next one.
struct RecentIds : InferenceState {
  std::string name() const override { return "RecentIds"; }
  int64_t length() const override { return seen; }
  void reset() override { ids = IndexTensor(), seen = 0; }
  IndexTensor ids;
  int64_t seen = 0;
};

class CharMLP : public LanguageModel {
 public:
  CharMLP(const ModelConfig& cfg, Rng& rng) : cfg_(cfg), k_(cfg.option_int("char_mlp_context")) {
    TAPEFORMER_CHECK(k_ >= 1 && k_ <= 64, "model.char_mlp_context must be in [1, 64], got ", k_);
    emb = register_module("emb", std::make_shared<Embedding>(cfg.vocab_size, cfg.n_embd, rng));
    fc = register_module("fc", std::make_shared<Linear>(k_ * cfg.n_embd, 4 * cfg.n_embd, true, rng));
    head = register_module("head", std::make_shared<Linear>(4 * cfg.n_embd, cfg.vocab_size, true, rng));
  }

  // One call for training, evaluation and sampling: the context's state, when
  // given, holds the last k - 1 ids of each row (RecentIds).
  Var forward(const IndexTensor& ids, const ModelContext& ctx) const override {
    TAPEFORMER_CHECK(ctx.memory == nullptr && !ctx.features && (ctx.inputs == nullptr || ctx.inputs->empty()),
                     "CharMLP: keeps no segment memory, exposes no features and reads no extra inputs");
    return ctx.state != nullptr ? read_on(ids, *ctx.state) : logits(ids);
  }
  using LanguageModel::forward;

  std::unique_ptr<InferenceState> make_state(int64_t, int64_t) const override { return std::make_unique<RecentIds>(); }
  const ModelConfig& config() const override { return cfg_; }

  std::shared_ptr<Embedding> emb;
  std::shared_ptr<Linear> fc, head;

 private:
  Var logits(const IndexTensor& ids) const {  // (B, T) -> (B, T, V)
    const Var e = emb->forward(ids);  // (B, T, C)
    const int64_t B = e.dim(0), T = e.dim(1), C = e.dim(2);
    std::vector<Var> window;  // e shifted by j positions (zeros before the start), j = k-1 .. 0
    for (int64_t j = k_ - 1; j >= 0; --j) {
      if (j == 0) window.push_back(e);
      else if (j >= T) window.push_back(Var(Tensor::zeros({B, T, C})));
      else window.push_back(concat({Var(Tensor::zeros({B, j, C})), slice(e, 1, 0, T - j)}, 1));
    }
    return head->forward(tanh(fc->forward(concat(window, 2))));  // (B, T, k C) -> (B, T, 4C) -> (B, T, V)
  }

  // The next T positions after those `state` has seen.
  Var read_on(const IndexTensor& ids, InferenceState& state) const {
    RecentIds& s = state_as<RecentIds>(state, "CharMLP", "RecentIds");
    const int64_t B = ids.shape[0], T = ids.shape[1], P = s.seen == 0 ? 0 : s.ids.shape[1];
    std::vector<int32_t> joined;  // the kept ids, then the new ones, per row
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < P; ++t) joined.push_back(s.ids.data[static_cast<size_t>(b * P + t)]);
      for (int64_t t = 0; t < T; ++t) joined.push_back(ids.data[static_cast<size_t>(b * T + t)]);
    }
    const IndexTensor all({B, P + T}, joined);
    const Var out = slice(logits(all), 1, P, P + T);  // the new positions' rows
    const int64_t keep = std::min<int64_t>(k_ - 1, P + T);
    std::vector<int32_t> kept;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = P + T - keep; t < P + T; ++t) kept.push_back(joined[static_cast<size_t>(b * (P + T) + t)]);
    s.ids = IndexTensor({B, keep}, kept);
    s.seen += T;
    return out;
  }

  ModelConfig cfg_;
  int64_t k_;
};

ModelKind char_mlp_model_kind() {
  ModelKind kind;
  kind.name = "char_mlp";
  kind.summary = "an MLP over the last model.char_mlp_context tokens (Bengio et al. 2003; examples/custom_attention)";
  kind.options = {{"char_mlp_context", int64_t{8}, "char_mlp: tokens the MLP reads, the current one included"}};
  kind.make = [](const ModelConfig& cfg, Rng& rng) -> std::unique_ptr<LanguageModel> {
    return std::make_unique<CharMLP>(cfg, rng);
  };
  kind.footprint = [](const ModelConfig& cfg) {
    const double V = static_cast<double>(cfg.vocab_size), C = static_cast<double>(cfg.n_embd);
    const double k = static_cast<double>(cfg.option_int("char_mlp_context"));
    ModelFootprint f;
    f.parameters = V * C + (k * C * 4 * C + 4 * C) + (4 * C * V + V);
    return f;
  };
  return kind;
}

int main(int argc, char** argv) {
  attention_kinds().add(sigmoid_attention_kind());
  attention_kinds().add(softcap::softcap_attention_kind());
  mlp_kinds().add(relu2_mlp_kind());
  optimizer_kinds().add(lion_optimizer_kind());
  model_kinds().add(char_mlp_model_kind());
  return cli_main(argc, argv);
}
