// Adaptive span (layers/attention/adaptive_span.h): at its largest span a head
// is plain softmax attention; spans are clamped after steps, penalised in the
// loss, logged, and far keys are not computed.
#include <doctest/doctest.h>

#include "tapeformer/core/error.h"
#include "golden.h"
#include "tapeformer/layers/attention/adaptive_span.h"
#include "tapeformer/layers/attention/softmax.h"

using namespace tapeformer;

namespace {

ModelConfig span_config(int64_t block) {
  ModelConfig c;
  c.block_size = block;
  c.n_head = 2;
  c.n_embd = 8;
  c.attention = "adaptive_span";
  c.options["span_ramp"] = int64_t{4};
  return c;
}

}  // namespace

TEST_CASE("adaptive span: a head whose span covers the sequence is softmax attention; a short span is a soft window") {
  const ModelConfig c = span_config(32);
  Rng r1(6), r2(6);
  AdaptiveSpanAttention span(c, std::make_shared<PositionalLayer>(), r1);
  MultiHeadAttention full(8, 2, true, 0.0f, residual_init_std(c), r2);  // the same draws: the same weights
  span.eval();
  full.eval();
  span.rho.value().fill(1.0f);  // z = S = 32: m(d) = 1 for every d < 32
  Tensor xt = Tensor::empty({2, 32, 8});
  r1.fill_normal(xt, 0.0f, 1.0f);
  NoGradGuard no_grad;
  check_close(span.forward(Var(xt), r1).value(), full.forward(Var(xt), r1).value(), "full span", 1e-5);
  CHECK(span.reach(32) == 32);
  // Span 8, ramp 4: distances 0..8 weigh 1, 9, 10, 11 weigh 3/4, 1/2, 1/4, farther keys nothing.
  span.rho.value().fill(0.25f);
  CHECK(span.reach(32) == 12);
  Tensor x2 = xt.clone();
  for (int64_t t = 0; t < 20; ++t)
    for (int64_t c2 = 0; c2 < 8; ++c2) x2.at({0, t, c2}) += 3.0f;  // change positions 0..19
  const Tensor a = span.forward(Var(xt), r1).value(), b = span.forward(Var(x2), r1).value();
  for (int64_t c2 = 0; c2 < 8; ++c2) CHECK(a.at({0, 31, c2}) == b.at({0, 31, c2}));  // 31 - 19 = 12: unseen
  CHECK(a.at({0, 30, 0}) != b.at({0, 30, 0}));  // 30 - 19 = 11: the ramp's last step
}

TEST_CASE("adaptive span: rho clamped after each optimizer step, lambda S mean(rho) as a loss, spans as metrics") {
  ModelConfig c = span_config(40);
  c.options["span_loss"] = 0.5;
  Rng rng(1);
  AdaptiveSpanAttention span(c, std::make_shared<PositionalLayer>(), rng);
  span.rho.value().at({0}) = -0.5f;
  span.rho.value().at({1}) = 1.7f;
  CHECK(span.auxiliary_loss(/*of_batch=*/false).item() == doctest::Approx(0.5 * 40 * 0.6));
  CHECK_FALSE(span.auxiliary_loss(/*of_batch=*/true).defined());  // a term of the parameters, not of a batch
  span.optimizer_stepped(1);
  CHECK(span.rho.value().to_vector() == std::vector<Scalar>{0.0f, 1.0f});
  const auto metrics = span.layer_metrics();
  REQUIRE(metrics.size() == 1);
  CHECK(metrics[0].first == "spans");
  CHECK(metrics[0].second == std::vector<double>{0.0, 40.0});
  CHECK(span.reach(1000) == 44);  // R + the widest span
}
