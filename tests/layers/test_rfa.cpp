// Random Feature Attention (layers/attention/rfa.h): its two ops pass
// gradcheck; values and gradients equal a PyTorch version of the paper's
// formula (ungated and gated); a constant gate c tends to ungated RFA as
// c -> 1; the denominator's clamp keeps outputs finite; training redraws
// the features every step and eval does not; generation equals the forward.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "kind_tests.h"
#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/rfa.h"

using namespace tapeformer;
using namespace kind_tests;

namespace {

ModelConfig rfa_config(bool gate) {
  ModelConfig c;
  c.block_size = 40;
  c.n_head = 2;
  c.n_embd = 8;
  c.attention = "rfa";
  c.options["rfa_features"] = int64_t{6};
  c.options["rfa_gate"] = gate;
  c.options["rfa_redraw"] = true;
  return c;
}

}  // namespace

TEST_CASE("rfa: gradcheck of the sin/cos features, the features of q, and the scan (ungated, gated, three chunks)") {
  CHECK(gradcheck([](const std::vector<Var>& in) { return rfa_sincos(in[0]); }, {normal({3, 7}, 1, 2.0f)},
                  "rfa_sincos")
            .ok);
  const Tensor eps = normal({2, 3, 4}, 2);
  const auto features = [&eps](const std::vector<Var>& in) { return rfa_features(in[0], in[1], eps); };
  const GradcheckResult f = gradcheck(features, {normal({1, 2, 5, 3}, 3), uniform({2, 3}, 4, 0.7f, 1.3f)},
                                      "rfa_features");
  CHECK_MESSAGE(f.ok, f.message);
  // 70 steps: chunks of 32, 32 and 6, so a state enters and leaves the middle chunk.
  const Tensor a = uniform({1, 2, 70, 4}, 5, 0.2f, 1.0f), b = uniform({1, 2, 70, 4}, 6, 0.2f, 1.0f);
  const Tensor v = normal({1, 2, 70, 3}, 7), g = uniform({1, 2, 70}, 8, 0.9f, 0.995f);  // a state outlives a chunk
  const GradcheckResult ungated =
      gradcheck([](const std::vector<Var>& in) { return rfa_scan(in[0], in[1], in[2]); }, {a, b, v}, "rfa_scan");
  CHECK_MESSAGE(ungated.ok, ungated.message);
  const GradcheckResult gated = gradcheck(
      [](const std::vector<Var>& in) { return rfa_scan(in[0], in[1], in[2], in[3]); }, {a, b, v, g}, "rfa_scan gated");
  CHECK_MESSAGE(gated.ok, gated.message);
}

TEST_CASE("rfa: values and gradients equal PyTorch's paper formula (ungated and gated)") {
  for (const char* name : {"rfa", "rfa_gated"}) {
    INFO(name);
    const Golden g = reference(name);
    const bool gated = std::string(name) == "rfa_gated";
    Var q(g.tensor("q"), true), k(g.tensor("k"), true), v(g.tensor("v"), true), sigma(g.tensor("sigma"), true);
    Var gate = gated ? Var(g.tensor("g"), true) : Var();
    const Tensor& eps = g.tensor("eps");
    const Var out = rfa_scan(rfa_features(q, sigma, eps), rfa_features(k, sigma, eps), v, gate);
    // 1e-4: float sums over 70 steps divided by signed denominators (the reference is float64).
    const double tol = 1e-4;
    check_close(out.value(), g.tensor("out"), std::string(name) + ": out", tol);
    backward(out, g.tensor("R"));
    check_close(q.grad(), g.tensor("grad_q"), "grad_q", tol);
    check_close(k.grad(), g.tensor("grad_k"), "grad_k", tol);
    check_close(v.grad(), g.tensor("grad_v"), "grad_v", tol);
    check_close(sigma.grad(), g.tensor("grad_sigma"), "grad_sigma", tol);
    if (gated) check_close(gate.grad(), g.tensor("grad_g"), "grad_g", tol);
  }
}

TEST_CASE("rfa: a constant gate c tends to ungated RFA as c -> 1 (the (1 - c) cancels); the clamp keeps d finite") {
  const Tensor a = uniform({1, 1, 12, 4}, 9, 0.2f, 1.0f), b = uniform({1, 1, 12, 4}, 10, 0.2f, 1.0f);
  const Tensor v = normal({1, 1, 12, 3}, 11);
  NoGradGuard no_grad;
  const Tensor ungated = rfa_scan(Var(a), Var(b), Var(v)).value();
  const auto gap = [&](float one_minus_c) {
    const Tensor g = Tensor::full({1, 1, 12}, 1.0f - one_minus_c);
    return max_abs_diff(rfa_scan(Var(a), Var(b), Var(v), Var(g)).value(), ungated);
  };
  const double far = gap(1.0f / 256), near = gap(1.0f / 4096);
  CHECK(far > 1e-3);                // a gate below 1 weighs recent positions more
  CHECK(near < far / 8);            // the gap shrinks with 1 - c (16x here)
  CHECK(near < 1e-3);

  // Features whose dot product is 0: d = 0 is clamped to 1e-4, never divided by.
  const Tensor zero_q = Tensor::zeros({1, 1, 3, 4});
  RfaClampCount clamps;
  const Tensor y = rfa_scan(Var(zero_q), Var(b.slice(2, 0, 3).contiguous()), Var(v.slice(2, 0, 3).contiguous()), Var(),
                            &clamps).value();
  for (Scalar e : y.to_vector()) CHECK(e == 0.0f);
  CHECK(clamps.seen == 3);
  CHECK(clamps.clamped == 3);
  rfa_scan(Var(a), Var(b), Var(v), Var(), &clamps);  // positive features: nothing clamped
  CHECK(clamps.seen == 15);
  CHECK(clamps.clamped == 3);
  Tensor signed_a = normal({1, 1, 12, 4}, 12), signed_b = normal({1, 1, 12, 4}, 13);
  for (Scalar e : rfa_scan(Var(signed_a), Var(signed_b), Var(v)).value().to_vector()) CHECK(std::isfinite(e));
}

TEST_CASE("rfa: training draws new features each optimizer step, eval keeps its fixed draw; generation equals the forward") {
  for (const bool gate : {false, true}) {
    INFO("gate " << gate);
    Rng rng(3);
    RandomFeatureAttention rfa(rfa_config(gate), std::make_shared<PositionalLayer>(), rng);
    CHECK(rfa.num_parameters() == static_cast<int64_t>(attention_kinds().get("rfa").parameters(rfa_config(gate))));
    const Tensor x = normal({1, 37, 8}, 14, 20.0f);
    Rng r1(5), r2(5);
    const Tensor t1 = rfa.forward(Var(x), r1).value();
    CHECK(max_abs_diff(rfa.forward(Var(x), r2).value(), t1) == 0.0);  // one step, one draw
    const Tensor drawn = rfa.train_draw.clone();
    CHECK(rfa.optimizer_stepped(1));  // a buffer changed
    CHECK(max_abs_diff(rfa.train_draw, drawn) > 0.1);
    const Tensor t2 = rfa.forward(Var(x), r1).value();
    CHECK(max_abs_diff(t1, t2) > 1e-4);  // the next step, the next draw
    Rng again(3);
    RandomFeatureAttention twin(rfa_config(gate), std::make_shared<PositionalLayer>(), again);
    twin.optimizer_stepped(1);
    CHECK(max_abs_diff(twin.train_draw, rfa.train_draw) == 0.0);  // from the init seed and the step
    rfa.eval();
    NoGradGuard no_grad;
    const Tensor whole = rfa.forward(Var(x), r1).value();
    CHECK(max_abs_diff(rfa.forward(Var(x), r2).value(), whole) == 0.0);  // eval: the fixed draw
    auto state = rfa.make_state(1, -1);
    const auto metrics = rfa.layer_metrics();  // the share of clamped denominators, then counting anew
    REQUIRE(metrics.size() == 1);
    CHECK(metrics[0].first == "clamped");
    CHECK(metrics[0].second[0] >= 0.0);
    CHECK(metrics[0].second[0] < 0.5);
    CHECK(rfa.layer_metrics()[0].second[0] == 0.0);  // no forward since
    check_close(rfa.forward(Var(x.slice(1, 0, 20).contiguous()), *state).value(), whole.slice(1, 0, 20).contiguous(),
                "prompt", 1e-5);
    for (int64_t t = 20; t < 37; ++t)
      check_close(rfa.forward(Var(x.slice(1, t, t + 1).contiguous()), *state).value(),
                  whole.slice(1, t, t + 1).contiguous(), "position " + std::to_string(t), 1e-5);
  }
}
