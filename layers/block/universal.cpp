#include "tapeformer/layers/block/universal.h"

#include <cmath>
#include <numeric>
#include <string>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"

namespace tapeformer {

// ---- ACT halting ----------------------------------------------------------------

ActHalting::ActHalting(const Shape& shape, float eps, int64_t max_steps)
    : threshold_(1.0f - eps),
      max_steps_(max_steps),
      sum_(Tensor::zeros(shape)),
      remainder_(Tensor::zeros(shape)),
      running_(Tensor::ones(shape)),
      steps_(Tensor::zeros(shape)) {
  TAPEFORMER_CHECK(eps > 0 && eps < 1 && max_steps >= 1, "ActHalting: epsilon must be in (0, 1) and max_steps >= 1, got ",
                   eps, " and ", max_steps);
}

Var ActHalting::step(const Var& p) {
  TAPEFORMER_CHECK(p.shape() == running_.shape(), "ActHalting: p ", p.shape(), " must be ", running_.shape());
  TAPEFORMER_CHECK(!done(), "ActHalting: every position has halted");
  ++n_;
  const Tensor pv = p.value().contiguous(), sv = sum_.value().contiguous();
  Tensor still = Tensor::zeros(running_.shape()), halts = Tensor::zeros(running_.shape());
  const Scalar* run = running_.data();
  Scalar* n = steps_.data();
  for (int64_t i = 0; i < running_.numel(); ++i) {
    if (run[i] == 0) continue;
    n[i] += 1;
    // The sum the position would reach, in the float arithmetic of sum_'s next value.
    if (n_ == max_steps_ || sv.data()[i] + pv.data()[i] > threshold_) halts.data()[i] = 1;
    else still.data()[i] = 1;
  }
  const Var continuing = mul(p, Var(still));                      // p^n where the position runs on
  const Var r = mul(Var(halts), add_scalar(neg(sum_), 1.0f));      // R = 1 - sum where it halts now
  sum_ = add(sum_, continuing);
  remainder_ = add(remainder_, r);
  running_ = still;
  return add(continuing, r);  // w^n, (B, T, 1)
}

bool ActHalting::done() const {
  const Scalar* run = running_.data();
  for (int64_t i = 0; i < running_.numel(); ++i)
    if (run[i] != 0) return false;
  return true;
}

Var ActHalting::ponder() const { return add(Var(steps_), remainder_); }

// ---- the stack ------------------------------------------------------------------

UniversalStack::UniversalStack(const ModelConfig& cfg, const Positional& positional, Rng& rng)
    : max_steps(cfg.n_layer),
      act(cfg.option_bool("act")),
      epsilon(static_cast<float>(cfg.option_number("act_epsilon"))),
      tau(static_cast<float>(cfg.option_number("act_tau"))),
      positional_(&positional),
      block_size_(cfg.block_size) {
  block = register_module("0", std::make_shared<TransformerBlock>(cfg, positional, rng));
  if (!act) return;
  halt = register_module("halt", std::make_shared<Linear>(cfg.n_embd, 1, true, rng));
  Tensor b = halt->bias.value();
  b.fill(static_cast<Scalar>(cfg.option_number("act_bias")));
  counts_ = register_statistic("act_counts", {max_steps});
  by_position_ = register_statistic("act_positions", {2, block_size_});
  last_counts_ = register_buffer("act_last_counts", Tensor::zeros({max_steps}));
  last_position_ = register_buffer("act_last_positions", Tensor::zeros({2, block_size_}));
}

Tensor UniversalStack::timestep(int64_t n) const {
  const int64_t C = block->ln_1->weight.dim(0);
  const double amplitude = kInitStd * std::sqrt(2.0);  // the sinusoidal positions' scale
  Tensor s = Tensor::empty({1, 1, C});
  for (int64_t c = 0; c < C; ++c) {
    const double angle = static_cast<double>(n - 1) / std::pow(10000.0, static_cast<double>(c / 2 * 2) / C);
    s.data()[c] = static_cast<Scalar>(amplitude * (c % 2 == 0 ? std::sin(angle) : std::cos(angle)));
  }
  return s;  // (1, 1, C)
}

Var UniversalStack::recur(const Var& x, int64_t start, bool every_step,
                          const std::function<Var(const Var&, int64_t, const std::vector<int64_t>&)>& layer) const {
  TAPEFORMER_CHECK(x.rank() == 3, "UniversalStack: input must be (B, T, C), got ", x.shape());
  const int64_t B = x.dim(0), T = x.dim(1);
  Var h = x, y;
  std::vector<int64_t> all(static_cast<size_t>(B * T));  // every row runs
  std::iota(all.begin(), all.end(), int64_t{0});
  ActHalting halting({B, T, 1}, act ? epsilon : 0.5f, max_steps);
  for (int64_t n = 1; n <= max_steps; ++n) {
    if (act && halting.done() && !every_step) break;  // nothing changes any more
    const Var s = add(n == 1 ? x : positional_->embed(h, start), Var(timestep(n)));  // (B, T, C)
    if (!act) {
      h = layer(s, n, all);
      continue;
    }
    const Tensor runs = halting.running().contiguous();  // (B, T, 1)
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < B * T; ++i)
      if (runs.data()[i] != 0) rows.push_back(i);
    const Var w = halting.done() ? Var() : halting.step(sigmoid(halt->forward(s)));
    h = where(runs, layer(s, n, rows), h);  // halted positions keep their state
    if (w.defined()) y = y.defined() ? add(y, mul(w, h)) : mul(w, h);
  }
  Ponder measured;
  measured.positions = B * T;
  if (!act) {
    measured.steps = static_cast<double>(max_steps * B * T);
    record(measured, false);
    return h;
  }
  const Var cost = halting.ponder();  // N + R, (B, T, 1)
  const Tensor N = halting.steps(), cost_values = cost.value().contiguous();
  for (int64_t i = 0; i < B * T; ++i) {
    measured.steps += N.data()[i];
    measured.remainder += cost_values.data()[i] - N.data()[i];  // from the values: no tape entry
  }
  record(measured, every_step);
  if (!is_training()) {  // evaluation may run forwards on several threads: one drops the cost
    const std::lock_guard<std::mutex> lock(mutex_);
    ponder_loss_ = Var();
    return y;
  }
  if (grad_enabled()) {
    ponder_loss_ = mul_scalar(mean(cost), tau);
    Tensor counts = counts_, positions = by_position_;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const auto steps = static_cast<int64_t>(N.data()[b * T + t]);
        counts.data()[steps - 1] += 1;
        if (t >= block_size_) continue;
        positions.data()[t] += static_cast<Scalar>(steps);
        positions.data()[block_size_ + t] += 1;
      }
  } else {
    ponder_loss_ = Var();
  }
  return y;  // (B, T, C)
}

void UniversalStack::record(const Ponder& measured, bool reading) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  last_ = measured;
  if (reading && act) reading_steps_ += measured.steps, reading_positions_ += static_cast<double>(measured.positions);
}

UniversalStack::Ponder UniversalStack::last_ponder() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return last_;
}

Var UniversalStack::forward(const Var& x, Rng& rng) const {
  // Each step of the recurrence is a layer for activation recompute.
  return recur(x, 0, false, [&](const Var& s, int64_t n, const std::vector<int64_t>&) {
    if (recomputes(static_cast<size_t>(n))) return recomputed_forward(block, s, rng);
    return release_rebuildable([&] { return block->forward(s, rng); });
  });
}

std::unique_ptr<InferenceState> UniversalStack::make_state(int64_t batch, int64_t window) const {
  auto state = std::make_unique<LayerStates>();
  for (int64_t n = 0; n < max_steps; ++n) state->layers.push_back(block->make_state(batch, window));
  return state;
}

Var UniversalStack::forward(const Var& x, InferenceState& state) const {
  LayerStates& s = LayerStates::of_stack(state, static_cast<size_t>(max_steps));
  // Every step of every new position: later positions read its keys at each
  // step; the halted ones' outputs are not computed unless at full depth.
  const Var y = recur(x, s.length(), true, [&](const Var& in, int64_t n, const std::vector<int64_t>& rows) {
    InferenceState& step = *s.layers[static_cast<size_t>(n - 1)];
    return full_depth() ? block->forward(in, step) : block->forward_rows(in, step, rows);
  });
  s.advance(x.dim(1));
  return y;
}

bool UniversalStack::after_optimizer_step(int64_t) {
  if (!act) return false;
  double total = 0;
  for (int64_t i = 0; i < max_steps; ++i) total += counts_.data()[i];
  if (total == 0) return false;  // no training forward since the last step
  Tensor counts = last_counts_, positions = last_position_, new_counts = counts_, new_positions = by_position_;
  std::copy(new_counts.data(), new_counts.data() + max_steps, counts.data());
  std::copy(new_positions.data(), new_positions.data() + 2 * block_size_, positions.data());
  new_counts.fill(0);
  new_positions.fill(0);
  return true;
}

std::vector<std::pair<std::string, std::vector<double>>> UniversalStack::own_metrics() const {
  if (!act) return {};
  std::vector<std::pair<std::string, std::vector<double>>> figures;
  double total = 0, steps = 0;
  for (int64_t i = 0; i < max_steps; ++i) {
    total += last_counts_.data()[i];
    steps += static_cast<double>(i + 1) * last_counts_.data()[i];
  }
  if (total > 0) {
    std::vector<double> hist, by_position;
    for (int64_t i = 0; i < max_steps; ++i) hist.push_back(last_counts_.data()[i] / total);
    for (int64_t t = 0; t < block_size_ && last_position_.data()[block_size_ + t] > 0; ++t)
      by_position.push_back(last_position_.data()[t] / last_position_.data()[block_size_ + t]);
    figures = {{"ponder_mean", {steps / total}}, {"ponder_hist", hist}, {"ponder_by_position", by_position}};
  }
  const std::lock_guard<std::mutex> lock(mutex_);
  if (reading_positions_ > 0) figures.push_back({"ponder_reading_mean", {reading_steps_ / reading_positions_}});
  return figures;
}

// ---- the registry entry ---------------------------------------------------------

BlockKind universal_block_kind() {
  BlockKind kind;
  kind.name = "universal";
  kind.summary = "Universal Transformer (Dehghani et al. 2019): one pre-LN block applied model.n_layer times with shared "
                 "weights, positions and a timestep signal added at each step; ACT halting per position (Graves 2016) "
                 "with the ponder cost in the loss";
  kind.options = {
      {"act", true, "universal: ACT halting per position (false: every position runs model.n_layer steps)"},
      {"act_epsilon", 0.01, "universal: a position halts once its halting probabilities sum past 1 - epsilon"},
      {"act_tau", 0.01, "universal: tau, the ponder cost tau mean(N + R) added to the loss"},
      {"act_bias", 1.0, "universal: the halting unit's initial bias (large: every position halts after one step)"}};
  kind.make = [](const ModelConfig& cfg, const Positional& positional, Rng& rng) {
    return std::make_shared<UniversalStack>(cfg, positional, rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    const double halting = cfg.option_bool("act") ? static_cast<double>(cfg.n_embd) + 1 : 0;
    // The model counts the positional scheme's parameters for n_layer attention layers (Shaw's and
    // Transformer-XL's are per layer); the one shared block has one layer's.
    ModelConfig one = cfg;
    one.n_layer = 1;
    const PositionalKind& pos = positional_kinds().get(cfg.positional);
    return transformer_block_parameters(cfg) + halting - (pos.parameters(cfg) - pos.parameters(one));
  };
  kind.check = [](const ModelConfig& cfg) {
    const double eps = cfg.option_number("act_epsilon"), tau = cfg.option_number("act_tau"),
                 bias = cfg.option_number("act_bias");
    TAPEFORMER_CHECK(eps > 0 && eps < 1, "model.act_epsilon must be in (0, 1), got ", eps);
    TAPEFORMER_CHECK(std::isfinite(tau) && tau >= 0, "model.act_tau must be a finite number >= 0, got ", tau);
    TAPEFORMER_CHECK(std::isfinite(bias), "model.act_bias must be a finite number, got ", bias);
  };
  return kind;
}

}  // namespace tapeformer
