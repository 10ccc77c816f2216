// DA-Transformer attention (layers/attention/distance_aware.h): at alpha = 0
// without the ReLU it is plain softmax attention; values and gradients equal
// a PyTorch implementation of the paper's formula; the map's gradient passes
// a finite-difference check; beta is clamped; the cache generates.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "kind_tests.h"
#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/distance_aware.h"
#include "tapeformer/layers/attention/softmax.h"

using namespace tapeformer;
using namespace kind_tests;

namespace {

ModelConfig da_config(bool relu) {
  ModelConfig c;
  c.block_size = 24;
  c.n_head = 2;
  c.n_embd = 8;
  c.attention = "da";
  c.options["da_relu"] = relu;
  return c;
}

// (T, T): 0 on and below the diagonal, -inf above it.
Tensor causal_bias(int64_t T) {
  Tensor m = Tensor::zeros({T, T});
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = i + 1; j < T; ++j) m.at({i, j}) = -std::numeric_limits<Scalar>::infinity();
  return m;
}

}  // namespace

TEST_CASE("da: alpha = 0 without the ReLU is softmax attention; with it, attention over ReLU(scores)") {
  Rng r1(6), r2(6);
  DistanceAwareAttention da(da_config(false), std::make_shared<PositionalLayer>(), r1);
  MultiHeadAttention full(8, 2, true, 0.0f, residual_init_std(da_config(false)), r2);  // the same draws
  da.eval();
  full.eval();
  const Tensor x = normal({2, 24, 8}, 3, 30.0f);  // scores of order one through the 0.02-scale weights
  NoGradGuard no_grad;
  const Tensor before = da.forward(Var(x), r1).value();
  CHECK(max_abs_diff(before, full.forward(Var(x), r1).value()) > 1e-3);  // alpha = linspace(-1, 1): not plain
  da.weighting.value().fill(0.0f);  // alpha = 0: f = 1 at every distance, whatever beta
  check_close(da.forward(Var(x), r1).value(), full.forward(Var(x), r1).value(), "alpha = 0, no ReLU", 1e-6);
  da.weighting.value().at({1, 0}) = 3.0f;
  da.weighting.value().at({1, 1}) = -2.0f;
  check_close(da.forward(Var(x), r1).value(), full.forward(Var(x), r1).value(), "alpha = 0, beta != 0", 1e-6);

  // With the ReLU, alpha = 0 is softmax over ReLU(s): negative scores weigh e^0, not nothing.
  const Tensor q = normal({1, 2, 9, 4}, 4), k = normal({1, 2, 9, 4}, 5), v = normal({1, 2, 9, 4}, 6);
  const Var w(Tensor::zeros({2, 2}));
  const Var relu_scores = relu(mul_scalar(matmul(Var(q), transpose(Var(k), 2, 3)), 0.5f));  // (1, 2, 9, 9)
  const Var reference = matmul(softmax(add(relu_scores, Var(causal_bias(9)))), Var(v));
  check_close(distance_aware_attention(Var(q), Var(k), Var(v), w, true).value(), reference.value(),
              "alpha = 0, ReLU", 1e-6);
}

TEST_CASE("da: values and gradients equal PyTorch's paper formula (ReLU on and off)") {
  for (const char* name : {"da_attention", "da_attention_norelu"}) {
    INFO(name);
    const Golden g = reference(name);
    const bool relu = std::string(name) == "da_attention";
    Var q(g.tensor("q"), true), k(g.tensor("k"), true), v(g.tensor("v"), true), w(g.tensor("weighting"), true);
    const Var out = distance_aware_attention(q, k, v, w, relu);
    check_close(out.value(), g.tensor("out"), std::string(name) + ": out");
    backward(out, g.tensor("R"));
    check_close(q.grad(), g.tensor("grad_q"), "grad_q");
    check_close(k.grad(), g.tensor("grad_k"), "grad_k");
    check_close(v.grad(), g.tensor("grad_v"), "grad_v");
    check_close(w.grad(), g.tensor("grad_weighting"), "grad_weighting");
  }
}

TEST_CASE("da: the distance weighting's gradient passes gradcheck, causal and over a cache's offset") {
  for (const bool relu : {true, false}) {
    INFO("relu " << relu);
    const Tensor q = normal({1, 2, 5, 3}, 11), k = normal({1, 2, 7, 3}, 12), v = normal({1, 2, 7, 3}, 13);
    Tensor w = normal({2, 2}, 14, 0.5f);
    const auto f = [relu](const std::vector<Var>& in) {
      return distance_aware_attention(in[0], in[1], in[2], in[3], relu);  // 5 queries: the last of 7 positions
    };
    CHECK(gradcheck(f, {q, k, v, w}).ok);
  }
}

TEST_CASE("da: beta clamped at 20 after a step; alpha and beta logged; generation equals the forward") {
  Rng rng(2);
  DistanceAwareAttention da(da_config(true), std::make_shared<PositionalLayer>(), rng);
  CHECK(da.weighting.value().to_vector() == std::vector<Scalar>{-1.0f, 1.0f, 0.0f, 0.0f});
  da.weighting.value().at({1, 1}) = 25.0f;
  da.optimizer_stepped(1);
  CHECK(da.weighting.value().at({1, 1}) == 20.0f);
  const auto metrics = da.layer_metrics();
  REQUIRE(metrics.size() == 2);
  CHECK(metrics[0].first == "alpha");
  CHECK(metrics[1].second == std::vector<double>{0.0, 20.0});

  da.weighting.value().at({1, 1}) = 0.5f;
  da.eval();
  NoGradGuard no_grad;
  const Tensor x = normal({1, 13, 8}, 9);
  const Tensor whole = da.forward(Var(x), rng).value();
  auto state = da.make_state(1, -1);
  const Tensor first = da.forward(Var(x.slice(1, 0, 6).contiguous()), *state).value();
  check_close(first, whole.slice(1, 0, 6).contiguous(), "prompt", 1e-5);
  for (int64_t t = 6; t < 13; ++t) {
    const Tensor step = da.forward(Var(x.slice(1, t, t + 1).contiguous()), *state).value();
    check_close(step, whole.slice(1, t, t + 1).contiguous(), "position " + std::to_string(t), 1e-5);
  }
}

TEST_CASE("da: rows longer than one kernel tile equal the formula composed from ops (values and gradients)") {
  // 130 queries and keys: three query tiles and three key tiles, so the kernel's tile passes of the
  // backward (the key-tile pass gets no partial for the parameters) all run the map.
  const int64_t H = 2, T = 130, D = 4;
  for (const bool relu_on : {true, false}) {
    INFO("relu " << relu_on);
    const Tensor q = normal({1, H, T, D}, 21), k = normal({1, H, T, D}, 22), v = normal({1, H, T, D}, 23);
    const Tensor w = Tensor::from({2, H}, {-0.05f, 0.02f, 0.3f, -0.4f});
    const Tensor seed = normal({1, H, T, D}, 24);
    const auto run = [&](bool kernel) {
      Var qv(q, true), kv(k, true), vv(v, true), wv(w, true);
      Var y;
      if (kernel) {
        y = distance_aware_attention(qv, kv, vv, wv, relu_on);
      } else {
        std::vector<Scalar> dist(static_cast<size_t>(T * T));
        for (int64_t i = 0; i < T; ++i)
          for (int64_t j = 0; j < T; ++j) dist[static_cast<size_t>(i * T + j)] = static_cast<Scalar>(std::abs(i - j));
        const Var R(Tensor::from({1, T, T}, dist));
        const Var alpha = reshape(slice(wv, 0, 0, 1), {H, 1, 1}), beta = reshape(slice(wv, 0, 1, 2), {H, 1, 1});
        const Var f = div(add_scalar(exp(beta), 1.0f), add_scalar(exp(sub(beta, mul(alpha, R))), 1.0f));  // (H, T, T)
        Var s = mul_scalar(matmul(qv, transpose(kv, 2, 3)), 0.5f);  // / sqrt(D)
        if (relu_on) s = relu(s);
        y = matmul(softmax(add(mul(s, f), Var(causal_bias(T)))), vv);
      }
      backward(y, seed);
      return std::vector<Tensor>{y.value(), qv.grad(), kv.grad(), vv.grad(), wv.grad()};
    };
    const std::vector<Tensor> fast = run(true), composed = run(false);
    const char* names[] = {"y", "dq", "dk", "dv", "dweighting"};
    for (size_t i = 0; i < fast.size(); ++i) check_close(fast[i], composed[i], names[i], 1e-4);
  }
}
