#include "tapeformer/layers/models/early_exit.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/memory/memory.h"

namespace tapeformer {

namespace {

void check_config(const ModelConfig& cfg) {
  TAPEFORMER_CHECK(cfg.block == "standard", "model.arch \"early_exit\" reads every layer of a standard stack: it needs "
                                            "model.block \"standard\", got \"", cfg.block, "\"");
  TAPEFORMER_CHECK(memories_on(cfg).empty(), "model.arch \"early_exit\" carries no segment memory (set model.mem_len "
                                             "and the other memory keys to 0)");
  const std::string heads = cfg.option_string("exit_heads"), weights = cfg.option_string("exit_weights");
  TAPEFORMER_CHECK(heads == "shared" || heads == "per_layer", "model.exit_heads must be \"shared\" or \"per_layer\", got \"",
                   heads, "\"");
  TAPEFORMER_CHECK(weights == "linear" || weights == "uniform",
                   "model.exit_weights must be \"linear\" or \"uniform\", got \"", weights, "\"");
  EarlyExitLM::parse_confidence(cfg.option_string("exit_confidence"));
}

// The state of a model reading piece by piece: each layer's, and the positions seen.
class ExitState : public InferenceState {
 public:
  std::string name() const override { return "early-exit state"; }
  int64_t length() const override { return length_; }
  void reset() override {
    layers->reset();
    length_ = 0;
  }
  const EarlyExitLM* owner = nullptr;
  std::unique_ptr<InferenceState> layers;  // the stack's LayerStates
  int64_t batch = 0, length_ = 0;
};

}  // namespace

EarlyExitLM::Confidence EarlyExitLM::parse_confidence(const std::string& name) {
  if (name == "max") return Confidence::max;
  if (name == "margin") return Confidence::margin;
  if (name == "cosine") return Confidence::cosine;
  fail("model.exit_confidence must be \"max\", \"margin\" or \"cosine\", got \"", name, "\"");
}

const char* EarlyExitLM::confidence_name(Confidence c) {
  return c == Confidence::max ? "max" : c == Confidence::margin ? "margin" : "cosine";
}

EarlyExitLM::EarlyExitLM(const ModelConfig& cfg, Rng& rng) : TransformerLM(cfg, rng) {
  check_config(cfg);
  blocks = std::dynamic_pointer_cast<StandardStack>(stack);
  TAPEFORMER_CHECK(blocks != nullptr, "model.arch \"early_exit\": the stack is not a standard one");
  const auto L = static_cast<int64_t>(blocks->blocks.size());
  if (cfg.option_string("exit_heads") == "per_layer")
    for (int64_t n = 1; n < L; ++n) {
      exit_norms.push_back(register_module("exit_ln_" + std::to_string(n), std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias, cfg.norm_eps)));
      exit_heads.push_back(
          register_module("exit_head_" + std::to_string(n), std::make_shared<Linear>(cfg.n_embd, cfg.vocab_size, false, rng)));
    }
  threshold_ = register_buffer("exit_threshold", Tensor::full({1}, 2.0f));
  measure_ = register_buffer(
      "exit_measure", Tensor::full({1}, static_cast<Scalar>(parse_confidence(cfg.option_string("exit_confidence")))));
  const bool linear = cfg.option_string("exit_weights") == "linear";
  for (int64_t n = 1; n <= L; ++n)
    weights_.push_back(linear ? 2.0 * static_cast<double>(n) / static_cast<double>(L * (L + 1)) : 1.0 / static_cast<double>(L));
  counts_.assign(static_cast<size_t>(L), 0);
}

ModelFootprint EarlyExitLM::footprint(const ModelConfig& cfg) {
  cfg.validate_kinds();
  check_config(cfg);
  ModelFootprint f = TransformerLM::footprint(cfg);
  if (cfg.option_string("exit_heads") == "per_layer") {
    const double C = static_cast<double>(cfg.n_embd), V = static_cast<double>(cfg.vocab_size), b = cfg.bias ? 1 : 0;
    f.parameters += static_cast<double>(cfg.n_layer - 1) * (C + b * C + C * V);
  }
  return f;
}

double EarlyExitLM::threshold() const { return threshold_.data()[0]; }

void EarlyExitLM::set_threshold(double lambda) {
  TAPEFORMER_CHECK(std::isfinite(lambda), "early exit: the threshold must be finite, got ", lambda);
  Tensor t = threshold_;
  t.data()[0] = static_cast<Scalar>(lambda);
}

EarlyExitLM::Confidence EarlyExitLM::measure() const {
  const auto m = static_cast<int>(measure_.data()[0]);
  TAPEFORMER_CHECK(m >= 0 && m <= 2, "early exit: exit_measure holds ", measure_.data()[0], ", not 0, 1 or 2");
  return static_cast<Confidence>(m);
}

void EarlyExitLM::set_measure(Confidence c) {
  Tensor t = measure_;
  t.data()[0] = static_cast<Scalar>(c);
}

std::vector<double> EarlyExitLM::loss_weights() const { return weights_; }

Var EarlyExitLM::exit_logits(const Var& h, int64_t n) const {
  const auto L = static_cast<int64_t>(blocks->blocks.size());
  TAPEFORMER_CHECK(n >= 1 && n <= L, "early exit: layer ", n, " of ", L);
  if (n == L || exit_heads.empty()) return logits_from_features(ln_f->forward(h));  // (B, T, V)
  const auto i = static_cast<size_t>(n - 1);
  return exit_heads[i]->forward(exit_norms[i]->forward(h));  // (B, T, V)
}

Var EarlyExitLM::exit_logits(const Var& h, int64_t n, const std::vector<int64_t>& rows) const {
  const auto L = static_cast<int64_t>(blocks->blocks.size());
  TAPEFORMER_CHECK(n >= 1 && n <= L, "early exit: layer ", n, " of ", L);
  if (n == L || exit_heads.empty()) return logits_from_features(norm_rows(*ln_f, h, rows));  // (1, R, V)
  const auto i = static_cast<size_t>(n - 1);
  return exit_heads[i]->forward(norm_rows(*exit_norms[i], h, rows));  // (1, R, V)
}

Tensor EarlyExitLM::confidence(const Tensor& logits_in, const Tensor& h_in, const Tensor& before_in) const {
  const Confidence m = measure();
  TAPEFORMER_CHECK(m == Confidence::cosine || logits_in.defined(), "early exit: the \"", confidence_name(m),
                   "\" confidence reads the logits");
  const Tensor h = h_in.contiguous(), g = before_in.contiguous();
  const Tensor z = m == Confidence::cosine ? Tensor() : logits_in.contiguous();
  TAPEFORMER_CHECK(h.shape() == g.shape() && (!z.defined() || (z.dim(0) == h.dim(0) && z.dim(1) == h.dim(1))),
                   "early exit: confidence of logits ", z.defined() ? z.shape().str() : std::string("(none)"),
                   ", states ", h.shape(), " and ", g.shape(), ": the positions must agree");
  const int64_t V = z.defined() ? z.dim(2) : 0, C = h.dim(2), N = h.dim(0) * h.dim(1);
  Tensor c = Tensor::empty({h.dim(0), h.dim(1)});
  const Scalar *hs = h.data(), *gs = g.data();
  for (int64_t i = 0; i < N; ++i) {
    if (m == Confidence::cosine) {
      double dot = 0, a = 0, b = 0;
      for (int64_t k = 0; k < C; ++k) {
        const double x = hs[i * C + k], y = gs[i * C + k];
        dot += x * y, a += x * x, b += y * y;
      }
      c.data()[i] = static_cast<Scalar>(a > 0 && b > 0 ? dot / std::sqrt(a * b) : 1.0);
      continue;
    }
    const Scalar* row = z.data() + i * V;
    double top = -INFINITY, second = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      if (row[v] > top) second = top, top = row[v];
      else if (row[v] > second) second = row[v];
    }
    double denominator = 0;
    for (int64_t v = 0; v < V; ++v) denominator += std::exp(static_cast<double>(row[v]) - top);
    const double p1 = 1.0 / denominator, p2 = V > 1 ? std::exp(second - top) / denominator : 0.0;
    c.data()[i] = static_cast<Scalar>(m == Confidence::max ? p1 : p1 - p2);
  }
  return c;  // (B, T)
}

Var EarlyExitLM::run_layers(const Var& x, const ModelContext& ctx,
                            const std::function<Var(size_t, const Var&)>& layer) const {
  const size_t L = blocks->blocks.size();
  const double lambda = threshold();
  counted(IndexTensor(), /*drop_loss=*/true);
  if (is_training() || lambda > 1) {  // no position leaves: the TransformerLM's computation
    const bool losses = is_training() && ctx.targets != nullptr && L > 1 &&
                        std::any_of(ctx.targets->data.begin(), ctx.targets->data.end(), [](int32_t t) { return t >= 0; });
    Var h = x, aux;
    for (size_t i = 0; i < L; ++i) {
      h = layer(i, h);
      if (!losses || i + 1 == L) continue;
      const Var term = mul_scalar(cross_entropy(exit_logits(h, static_cast<int64_t>(i + 1)), *ctx.targets),
                                  static_cast<Scalar>(weights_[i]));
      aux = aux.defined() ? add(aux, term) : term;
    }
    const Var features = ln_f->forward(h);  // (B, T, C)
    if (ctx.features) return features;
    const Var logits = logits_from_features(features);  // (B, T, V)
    if (losses)  // total = CE^L + aux = sum_n w_n CE^n
      exit_loss_ = sub(aux, mul_scalar(cross_entropy(logits, *ctx.targets), static_cast<Scalar>(1.0 - weights_[L - 1])));
    return logits;
  }
  TAPEFORMER_CHECK(!ctx.features, "model.arch \"early_exit\": with exits on (exit_threshold <= 1) a position's output "
                                  "comes from its exit layer's head, so the model has no one feature vector to return");
  const int64_t B = x.dim(0), T = x.dim(1);
  Tensor running = Tensor::ones({B, T, 1});
  IndexTensor exits({B, T}, std::vector<int32_t>(static_cast<size_t>(B * T), static_cast<int32_t>(L)));
  std::vector<std::pair<Tensor, Var>> left;  // (mask (B, T, 1) of the positions leaving at n, head_n's logits)
  bool any_left = false;
  Var h = x;
  for (size_t i = 0; i < L; ++i) {
    Var next = layer(i, h);
    if (any_left) next = where(running, next, h);  // a position that left keeps its state
    const Var before = h;
    h = next;
    if (i + 1 == L) break;
    const Var logits = exit_logits(h, static_cast<int64_t>(i + 1));
    const Tensor c = confidence(logits.value(), h.value(), before.value());
    Tensor leaving = Tensor::zeros({B, T, 1});
    bool some = false;
    for (int64_t p = 0; p < B * T; ++p) {
      if (running.data()[p] == 0 || c.data()[p] < lambda) continue;
      leaving.data()[p] = 1;
      running.data()[p] = 0;
      exits.data[static_cast<size_t>(p)] = static_cast<int32_t>(i + 1);
      some = true;
    }
    if (!some) continue;
    left.emplace_back(leaving, logits);
    any_left = true;
  }
  Var out = logits_from_features(ln_f->forward(h));  // (B, T, V): the positions that ran every layer
  for (const auto& [mask, logits] : left) out = where(mask, logits, out);
  counted(exits);
  return out;
}

Var EarlyExitLM::run_skipping(const Var& x, LayerStates& layers) const {
  const size_t L = blocks->blocks.size();
  const double lambda = threshold();
  counted(IndexTensor(), /*drop_loss=*/true);
  const int64_t B = x.dim(0), T = x.dim(1);
  std::vector<int64_t> running(static_cast<size_t>(B * T));  // flat rows b * T + t still in, ascending
  std::iota(running.begin(), running.end(), int64_t{0});
  IndexTensor exits({B, T}, std::vector<int32_t>(running.size(), static_cast<int32_t>(L)));
  Tensor out;  // (B, T, V): each row from its exit layer's head
  const auto take = [&](const Tensor& logits, int64_t r, int64_t row) {  // row r of logits (1, R, V) -> out row
    const int64_t V = logits.dim(2);
    if (!out.defined()) out = Tensor::empty({B, T, V});
    std::copy_n(logits.data() + r * V, V, out.data() + row * V);
  };
  Var h = x;
  for (size_t i = 0; i < L; ++i) {
    const Var before = h;
    h = blocks->blocks[i]->forward_rows(h, *layers.layers[i], running);  // the others keep their state
    if (i + 1 == L || running.empty()) continue;
    // The cosine measure reads the states alone: the head runs for the positions leaving only.
    const bool cosine = measure() == Confidence::cosine;
    const auto n = static_cast<int64_t>(i + 1);
    Tensor logits = cosine ? Tensor() : exit_logits(h, n, running).value().contiguous();  // (1, R, V)
    const Tensor c = confidence(logits, pick_rows(h, running).value(), pick_rows(before, running).value());  // (1, R)
    std::vector<int64_t> still, leaving;
    for (size_t r = 0; r < running.size(); ++r) (c.data()[r] < lambda ? still : leaving).push_back(running[r]);
    if (cosine && !leaving.empty()) logits = exit_logits(h, n, leaving).value().contiguous();  // (1, leaving, V)
    for (size_t r = 0, k = 0; r < running.size(); ++r) {
      if (c.data()[r] < lambda) continue;
      take(logits, static_cast<int64_t>(cosine ? k++ : r), running[r]);
      exits.data[static_cast<size_t>(running[r])] = static_cast<int32_t>(n);
    }
    running = std::move(still);
  }
  if (!running.empty()) {  // the positions that ran every layer
    const Tensor logits = exit_logits(h, static_cast<int64_t>(L), running).value().contiguous();  // (1, R, V)
    for (size_t r = 0; r < running.size(); ++r) take(logits, static_cast<int64_t>(r), running[r]);
  }
  counted(exits);
  return Var(out);  // (B, T, V)
}

Var EarlyExitLM::forward(const IndexTensor& ids, const ModelContext& ctx) const {
  TAPEFORMER_CHECK(ctx.inputs == nullptr || ctx.inputs->empty(), "model.arch \"early_exit\" reads no extra inputs");
  TAPEFORMER_CHECK(ctx.memory == nullptr, "model.arch \"early_exit\" carries no segment memory");
  TAPEFORMER_CHECK(ids.shape.rank() == 2 && ids.shape[1] >= 1, "EarlyExitLM: ids must be (B, T) with T >= 1, got ",
                   ids.shape);
  const int64_t T = ids.shape[1], limit = max_positions();
  if (ctx.state == nullptr) {
    TAPEFORMER_CHECK(limit < 0 || T <= limit, "EarlyExitLM: sequence length ", T, " exceeds the ", limit,
                     " positions of model.positional \"", config().positional, "\" (model.block_size)");
    TAPEFORMER_CHECK(ctx.rng != nullptr || !is_training() || config().dropout == 0.0f,
                     "EarlyExitLM: training with model.dropout needs an Rng (ModelContext::rng)");
    Rng none(0);
    Rng& rng = ctx.rng != nullptr ? *ctx.rng : none;
    const Var x = drop->forward(pos_emb->embed(tok_emb->forward(ids), 0), rng);  // (B, T, C)
    return run_layers(x, ctx, [&](size_t i, const Var& h) { return blocks->layer_forward(i, h, rng); });
  }
  ExitState& s = state_as<ExitState>(*ctx.state, "EarlyExitLM", "early-exit state");
  TAPEFORMER_CHECK(s.owner == this, "EarlyExitLM: this inference state was made by another model");
  TAPEFORMER_CHECK(!grad_enabled() && !is_training(),
                   "EarlyExitLM: the inference-state forward is for inference (eval() and NoGradGuard)");
  TAPEFORMER_CHECK(ids.shape[0] == s.batch, "EarlyExitLM: ids ", ids.shape, " for a state of ", s.batch, " sequences");
  TAPEFORMER_CHECK(limit < 0 || s.length_ + T <= limit, "EarlyExitLM: ", s.length_, " positions seen + ", T,
                   " new exceed the ", limit, " positions of model.positional \"", config().positional,
                   "\" (reset the state and feed the last ", limit, " tokens)");
  LayerStates& layers = LayerStates::of_stack(*s.layers, blocks->blocks.size());
  try {
    const Var x = pos_emb->embed(tok_emb->forward(ids), s.length_);  // (B, T, C)
    ModelContext inner = ctx;
    inner.state = nullptr;
    const bool skipping = threshold() <= 1 && !full_depth() && !ctx.features;  // features: run_layers refuses
    const Var y = skipping ? run_skipping(x, layers) : run_layers(x, inner, [&](size_t i, const Var& h) {
      return blocks->blocks[i]->forward(h, *layers.layers[i]);
    });
    layers.advance(T);
    s.length_ += T;
    return y;
  } catch (...) {
    s.reset();
    throw;
  }
}

std::unique_ptr<InferenceState> EarlyExitLM::make_state(int64_t batch, int64_t window) const {
  TAPEFORMER_CHECK(batch >= 1, "EarlyExitLM: batch size must be >= 1, got ", batch);
  auto state = std::make_unique<ExitState>();
  state->owner = this;
  state->batch = batch;
  state->layers = blocks->make_state(batch, window == 0 ? config().block_size : window);
  return state;
}

void EarlyExitLM::counted(const IndexTensor& exits, bool drop_loss) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (drop_loss) exit_loss_ = Var();
  for (int32_t n : exits.data) ++counts_[static_cast<size_t>(n - 1)];
  last_exits_ = exits;
}

std::vector<int64_t> EarlyExitLM::exit_counts() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

void EarlyExitLM::reset_exit_counts() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  counts_.assign(counts_.size(), 0);
}

IndexTensor EarlyExitLM::last_exit_layers() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return last_exits_;
}

std::vector<std::pair<std::string, std::vector<double>>> EarlyExitLM::own_metrics() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  double total = 0, layers = 0;
  for (size_t n = 0; n < counts_.size(); ++n) {
    total += static_cast<double>(counts_[n]);
    layers += static_cast<double>(n + 1) * static_cast<double>(counts_[n]);
  }
  if (total == 0) return {};
  std::vector<double> share;
  for (int64_t c : counts_) share.push_back(static_cast<double>(c) / total);
  return {{"exit_layers_mean", {layers / total}}, {"exit_share", share}};
}

ModelKind early_exit_model_kind() {
  ModelKind kind;
  kind.name = "early_exit";
  kind.summary = "GPT with an output head after every layer (Elbayad et al. 2020), trained on the layers' weighted "
                 "losses; a position leaves at the first layer whose confidence passes the calibrated threshold, its "
                 "state copied into the later layers (CALM, Schuster et al. 2022)";
  kind.options = {
      {"exit_heads", std::string("shared"), "early_exit: shared (every layer uses the final head) | per_layer (a head each)"},
      {"exit_weights", std::string("linear"), "early_exit: the layers' loss weights: linear (w_n ∝ n, CALM) | uniform"},
      {"exit_confidence", std::string("max"),
       "early_exit: max (softmax) | margin (top-2 gap) | cosine (consecutive states), until tapeformer calibrate sets "
       "another"}};
  kind.make = [](const ModelConfig& cfg, Rng& rng) -> std::unique_ptr<LanguageModel> {
    return std::make_unique<EarlyExitLM>(cfg, rng);
  };
  kind.footprint = EarlyExitLM::footprint;
  return kind;
}

}  // namespace tapeformer
