// The Universal Transformer with ACT (layers/block/universal.h): one step
// without ACT is one block; a halting bias that stops every position after
// one step is one step; ACT's N, R and weights on hand-worked cases, their
// gradients (d(N + R)/dp^n = -1 for n < N) and a gradcheck; halted
// positions keep their state; the ponder cost, statistics and metrics.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "kind_tests.h"
#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/block/universal.h"
#include "tapeformer/layers/language_model.h"

using namespace tapeformer;
using namespace kind_tests;

namespace {

ModelConfig ut_config(int64_t steps, bool act) {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 16;
  c.n_layer = steps;
  c.n_head = 2;
  c.n_embd = 8;
  c.block = "universal";
  c.options["act"] = act;
  return c;
}

struct Built {
  std::shared_ptr<Positional> positional;
  std::shared_ptr<UniversalStack> stack;
};

Built build(const ModelConfig& cfg, uint64_t seed = 3) {
  cfg.validate_kinds();
  Rng rng(seed);
  Built b;
  b.positional = positional_kinds().get(cfg.positional).make(cfg, rng);
  b.stack = std::make_shared<UniversalStack>(cfg, *b.positional, rng);
  return b;
}

}  // namespace

TEST_CASE("universal: one step without ACT is one block over x + S_1") {
  const Built b = build(ut_config(1, false));
  const Tensor x = normal({2, 9, 8}, 1);
  Rng r1(5), r2(5);
  const Tensor y = b.stack->forward(Var(x), r1).value();
  const Tensor one = b.stack->block->forward(add(Var(x), Var(b.stack->timestep(1))), r2).value();
  CHECK(max_abs_diff(y, one) == 0.0);
  // Three steps are the block three times, the positions added again before steps 2 and 3.
  const Built three = build(ut_config(3, false));
  Rng r3(5), r4(5);
  Var h(x);
  for (int64_t n = 1; n <= 3; ++n)
    h = three.stack->block->forward(add(n == 1 ? h : three.positional->embed(h, 0), Var(three.stack->timestep(n))), r4);
  CHECK(max_abs_diff(three.stack->forward(Var(x), r3).value(), h.value()) == 0.0);
  CHECK(max_abs_diff(three.stack->timestep(1), three.stack->timestep(2)) > 1e-3);  // the steps are told apart
}

TEST_CASE("universal: a halting bias that stops every position at once equals one step bit for bit") {
  ModelConfig cfg = ut_config(4, true);
  cfg.options["act_bias"] = 30.0;  // p = sigmoid(30 + ...) rounds to 1 > 1 - epsilon
  const Built b = build(cfg);
  const Tensor x = normal({2, 9, 8}, 1);
  Rng r1(5), r2(5);
  const Tensor y = b.stack->forward(Var(x), r1).value();
  const Tensor one = b.stack->block->forward(add(Var(x), Var(b.stack->timestep(1))), r2).value();
  CHECK(max_abs_diff(y, one) == 0.0);
  CHECK(b.stack->last_ponder().steps == 18.0);  // N = 1 at each of the 2 x 9 positions
  CHECK(b.stack->last_ponder().remainder == doctest::Approx(18.0));  // R = 1
}

TEST_CASE("universal: ACT's N, R and weights on hand-worked positions") {
  // Three positions, epsilon 0.01, at most 4 steps:
  //   a: 0.5, 0.6       -> halts at 2 (1.1 > 0.99), R = 0.5: weights 0.5, 0.5
  //   b: 0.3 each step  -> no sum passes 0.99; halts at K = 4, R = 1 - 0.9: 0.3, 0.3, 0.3, 0.1
  //   c: 0.995          -> halts at 1, R = 1: weight 1
  //   d: 0.48, 0.5      -> 0.98 does not pass 0.99; then 0.2 does: halts at 3, R = 1 - 0.98
  const std::vector<std::vector<float>> p = {{0.5f, 0.6f, 0.9f, 0.9f},
                                             {0.3f, 0.3f, 0.3f, 0.3f},
                                             {0.995f, 0.9f, 0.9f, 0.9f},
                                             {0.48f, 0.5f, 0.2f, 0.9f}};
  ActHalting act({4, 1, 1}, 0.01f, 4);
  std::vector<std::vector<float>> w(4);
  for (int64_t n = 0; !act.done(); ++n) {
    std::vector<Scalar> step;
    for (const auto& row : p) step.push_back(row[static_cast<size_t>(n)]);
    const Tensor wn = act.step(Var(Tensor::from({4, 1, 1}, step))).value();
    for (size_t i = 0; i < 4; ++i) w[i].push_back(wn.data()[i]);
  }
  CHECK(act.taken() == 4);
  const std::vector<std::vector<float>> want = {{0.5f, 0.5f, 0, 0}, {0.3f, 0.3f, 0.3f, 0.1f}, {1, 0, 0, 0},
                                                {0.48f, 0.5f, 0.02f, 0}};
  const std::vector<float> N = {2, 4, 1, 3}, ponder = {2.5f, 4.1f, 2.0f, 3.02f};
  const Tensor cost = act.ponder().value();
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    for (size_t n = 0; n < 4; ++n) CHECK(w[i][n] == doctest::Approx(want[i][n]).epsilon(1e-6));
    CHECK(act.steps().data()[i] == N[i]);
    CHECK(cost.data()[i] == doctest::Approx(ponder[i]).epsilon(1e-6));
  }
}

TEST_CASE("universal: the ponder cost's gradient is -1 for each step before N, 0 at N; gradcheck of the weights") {
  // p^n of 3 positions over 3 steps, away from the halting thresholds (a step of the check must not move N).
  const std::vector<Tensor> p = {Tensor::from({3, 1, 1}, {0.5f, 0.2f, 0.3f}), Tensor::from({3, 1, 1}, {0.7f, 0.3f, 0.2f}),
                                 Tensor::from({3, 1, 1}, {0.4f, 0.3f, 0.1f})};
  std::vector<Var> vars;
  for (const Tensor& t : p) vars.emplace_back(t.clone(), true);
  {
    TapeScope tape;
    ActHalting act({3, 1, 1}, 0.01f, 3);
    for (const Var& v : vars) act.step(v);
    backward(sum(act.ponder()));
  }
  // N = 2, 3, 3: position 0 has -1 at step 1 only; the others at steps 1 and 2.
  const std::vector<std::vector<float>> want = {{-1, 0, 0}, {-1, -1, 0}, {-1, -1, 0}};
  for (size_t i = 0; i < 3; ++i)
    for (size_t n = 0; n < 3; ++n) {
      const Tensor g = vars[n].grad();  // undefined: p^n reaches nothing (0)
      CHECK((g.defined() ? g.data()[i] : 0.0f) == want[i][n]);
    }
  const auto f = [](const std::vector<Var>& in) {
    ActHalting act({3, 1, 1}, 0.01f, 3);
    Var out;
    for (size_t n = 0; n < in.size(); ++n) {
      const Var w = mul_scalar(act.step(in[n]), static_cast<Scalar>(n + 1));  // each step's weight told apart
      out = out.defined() ? add(out, w) : w;
    }
    return add(out, act.ponder());
  };
  const GradcheckResult r = gradcheck(f, p, "act halting");
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("universal: halted positions keep their state; later steps read it as a key") {
  // The halting unit reads channel 0: x = +1 there halts after step 1 (p = 1),
  // x = -1 never halts (p = 0) and runs all 3 steps with weight R = 1 at the last.
  ModelConfig cfg = ut_config(3, true);
  const Built b = build(cfg);
  for (const Var& p : b.stack->block->parameters()) {  // branches as large as the state: the difference shows
    Tensor v = p.value();
    for (int64_t i = 0; i < v.numel(); ++i) v.data()[i] *= 4;
  }
  Tensor w = b.stack->halt->weight.value(), bias = b.stack->halt->bias.value();
  w.fill(0);
  w.data()[0] = 100;
  bias.fill(0);
  Tensor x = normal({1, 6, 8}, 2);
  const std::vector<bool> halts = {true, false, true, false, false, true};
  for (int64_t t = 0; t < 6; ++t) x.data()[t * 8] = halts[static_cast<size_t>(t)] ? 1.0f : -1.0f;
  CHECK(b.stack->timestep(1).data()[0] == 0.0f);  // sin(0): channel 0 is x's own at step 1
  b.stack->eval();
  NoGradGuard no_grad;
  Rng unused(0);
  const Tensor y = b.stack->forward(Var(x), unused).value();
  // The references, step by step: the halted rows frozen after step 1, or (wrongly) updated.
  const auto reference = [&](bool frozen) {
    Var h(x);
    Tensor keep = Tensor::zeros({1, 6, 1});
    for (int64_t t = 0; t < 6; ++t) keep.data()[t] = halts[static_cast<size_t>(t)] ? 1.0f : 0.0f;
    for (int64_t n = 1; n <= 3; ++n) {
      const Var s = add(n == 1 ? h : b.positional->embed(h, 0), Var(b.stack->timestep(n)));
      const Var out = b.stack->block->forward(s, unused);
      h = n == 1 || !frozen ? out : where(keep, h, out);
    }
    return h.value();
  };
  const Tensor frozen = reference(true), updated = reference(false);
  double running_vs_frozen = 0, running_vs_updated = 0;
  for (int64_t t = 0; t < 6; ++t) {
    if (halts[static_cast<size_t>(t)]) continue;
    for (int64_t c = 0; c < 8; ++c) {
      running_vs_frozen = std::max(running_vs_frozen, std::abs(double(y.at({0, t, c})) - frozen.at({0, t, c})));
      running_vs_updated = std::max(running_vs_updated, std::abs(double(y.at({0, t, c})) - updated.at({0, t, c})));
    }
  }
  CAPTURE(running_vs_updated);
  CHECK(running_vs_frozen < 1e-6);
  CHECK(running_vs_updated > 1e-4);
  CHECK(b.stack->last_ponder().steps == 3 * 1 + 3 * 3);
}

TEST_CASE("universal: the ponder cost enters the loss; the step's halting counts become its metrics") {
  ModelConfig cfg = ut_config(4, true);
  cfg.options["act_tau"] = 0.05;
  Rng rng(7);
  std::unique_ptr<LanguageModel> model = make_model(cfg, rng);
  const IndexTensor ids({3, 10}, std::vector<int32_t>(30, 4));
  TapeScope tape;
  Rng dropout(1);
  model->forward(ids, dropout);
  UniversalStack* stack = nullptr;
  model->visit([&](Module& m) {
    if (auto* s = dynamic_cast<UniversalStack*>(&m)) stack = s;
  });
  REQUIRE(stack != nullptr);
  const UniversalStack::Ponder& p = stack->last_ponder();
  CHECK(p.positions == 30);
  const Var aux = model->auxiliary_loss(/*of_batch=*/true);
  REQUIRE(aux.defined());
  CHECK(aux.item() == doctest::Approx(0.05 * (p.steps + p.remainder) / 30).epsilon(1e-5));
  CHECK_FALSE(model->auxiliary_loss(/*of_batch=*/false).defined());
  backward(aux);
  CHECK(std::abs(stack->halt->bias.grad().item()) > 0);  // the cost reaches the halting unit
  // The counts are statistics until the step, then the logged figures.
  double counted = 0;
  for (const auto& [name, t] : model->statistics())
    if (name == "act_counts")
      for (int64_t i = 0; i < t.numel(); ++i) counted += t.data()[i];
  CHECK(counted == 30);
  CHECK(model->layer_metrics().empty());  // before the first step: nothing to log
  CHECK(model->optimizer_stepped(1));
  const auto metrics = model->layer_metrics();
  REQUIRE(metrics.size() == 3);
  CHECK(metrics[0].first == "ponder_mean");
  CHECK(metrics[0].second[0] == doctest::Approx(p.steps / 30));
  double share = 0;
  for (double h : metrics[1].second) share += h;
  CHECK(share == doctest::Approx(1.0));
  CHECK(metrics[2].second.size() == 10);  // positions 0..9 seen
  for (const auto& [name, t] : model->statistics())
    for (int64_t i = 0; i < t.numel(); ++i) CHECK(t.data()[i] == 0);
  CHECK_FALSE(model->optimizer_stepped(2));  // no forward since: the figures stay
  // Evaluation forwards set no cost and count nothing.
  model->eval();
  {
    NoGradGuard no_grad;
    model->forward(ids, dropout);
  }
  CHECK_FALSE(model->auxiliary_loss(true).defined());
  CHECK_FALSE(model->optimizer_stepped(3));
}

TEST_CASE("universal: parameters of the kind; bad options and a segment memory are refused by name") {
  for (const bool act : {true, false}) {
    ModelConfig cfg = ut_config(6, act);
    Rng rng(1);
    const std::unique_ptr<LanguageModel> model = make_model(cfg, rng);  // refuses a count unlike the kind's
    ModelConfig one = cfg;
    one.block = "standard";
    one.n_layer = 1;
    one.options.clear();
    CHECK(model->num_parameters() == model_footprint(one).parameters + (act ? 9 : 0));
  }
  ModelConfig bad = ut_config(2, true);
  bad.options["act_epsilon"] = 1.0;
  CHECK_THROWS_WITH_AS(bad.validate_kinds(), doctest::Contains("model.act_epsilon"), Error);
  bad = ut_config(2, true);
  bad.options["act_tau"] = -1.0;
  CHECK_THROWS_WITH_AS(bad.validate_kinds(), doctest::Contains("model.act_tau"), Error);
  bad = ut_config(2, true);
  bad.options["mem_len"] = int64_t{8};
  CHECK_THROWS_AS(bad.validate_kinds(), Error);
}

TEST_CASE("universal: reading piece by piece, halted positions skip the block's output: the full-depth numbers bit for bit") {
  // A halted position still enters every later step's KV cache (its frozen
  // state), but only its keys and values are computed there.
  for (const auto& [positional, width] : std::vector<std::pair<std::string, int64_t>>{{"learned", 8}, {"rope", 8},
                                                                                      {"learned", 32}}) {
    CAPTURE(positional);
    CAPTURE(width);
    ModelConfig cfg = ut_config(4, true);
    cfg.positional = positional;
    cfg.n_embd = width;
    const Built b = build(cfg, 8);
    for (const Var& p : b.stack->parameters()) {  // halting probabilities that spread over the steps
      Tensor v = p.value();
      for (int64_t i = 0; i < v.numel(); ++i) v.data()[i] *= 3;
    }
    b.stack->eval();
    NoGradGuard no_grad;
    const auto skipping = b.stack->make_state(2, -1), full = b.stack->make_state(2, -1);
    std::vector<double> steps;
    uint64_t seed = 20;
    for (const int64_t T : {6, 1, 1, 3, 1}) {
      const Tensor x = normal({2, T, width}, seed++);
      b.stack->set_full_depth(true);
      CHECK(b.stack->full_depth());
      const Tensor want = b.stack->forward(Var(x), *full).value();
      const double want_steps = b.stack->last_ponder().steps;
      b.stack->set_full_depth(false);
      const Tensor got = b.stack->forward(Var(x), *skipping).value();
      CHECK(b.stack->last_ponder().steps == want_steps);
      CHECK(max_abs_diff(got, want) == 0.0);
      steps.push_back(want_steps / static_cast<double>(2 * T));
    }
    // Positions halted before the last step: something was skipped.
    CHECK(*std::min_element(steps.begin(), steps.end()) < 4.0);
  }
}
