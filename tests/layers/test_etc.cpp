// ETC global-local attention (layers/attention/etc.h): with no global tokens
// it is sliding-window attention; values and gradients equal a PyTorch
// version of the formula; gradcheck of the label biases and the global query;
// a global summarises only a complete earlier segment (the causality probe
// of every kind covers the rest); generation equals the forward.
#include <doctest/doctest.h>

#include <cmath>

#include "kind_tests.h"
#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/etc.h"

using namespace tapeformer;
using namespace kind_tests;

namespace {

ModelConfig etc_config(int64_t segment, int64_t radius) {
  ModelConfig c;
  c.block_size = 100;
  c.n_head = 2;
  c.n_embd = 8;
  c.attention = "etc";
  c.options["etc_segment"] = segment;
  c.options["etc_radius"] = radius;
  return c;
}

}  // namespace

TEST_CASE("etc: no global tokens is sliding-window attention; a radius covering the sequence is full attention") {
  const Tensor q = normal({2, 2, 70, 4}, 1), k = normal({2, 2, 70, 4}, 2), v = normal({2, 2, 70, 4}, 3);
  const Var q_g(normal({2, 4}, 4));
  for (const int64_t r : {int64_t{5}, int64_t{69}}) {
    CAPTURE(r);
    // The reference from primitives: causal scores, keys more than r back hidden.
    std::vector<Scalar> mask(70 * 70, 0.0f);
    for (int64_t i = 0; i < 70; ++i)
      for (int64_t j = 0; j < 70; ++j) mask[static_cast<size_t>(i * 70 + j)] = j > i || i - j > r ? 1.0f : 0.0f;
    const Var s = masked_fill(mul_scalar(matmul(Var(q), transpose(Var(k), 2, 3)), 0.5f), Tensor::from({70, 70}, mask),
                              -INFINITY);
    const Tensor window = matmul(softmax(s), Var(v)).value();
    const Var labels(Tensor::zeros({2, r + 2}));
    check_close(etc_attention(Var(q), Var(k), Var(v), q_g, labels, /*segment=*/0, r).value(), window, "window", 1e-5);
    if (r == 69) {
      AttentionSpec full;
      check_close(window, softmax_attention(Var(q), Var(k), Var(v), full).value(), "full", 1e-5);
    }
  }
}

TEST_CASE("etc: values and gradients equal PyTorch's formula (with globals, and without)") {
  for (const char* name : {"etc", "etc_local"}) {
    INFO(name);
    const Golden g = reference(name);
    Var q(g.tensor("q"), true), k(g.tensor("k"), true), v(g.tensor("v"), true), q_g(g.tensor("q_g"), true),
        labels(g.tensor("labels"), true);
    const int64_t segment = std::string(name) == "etc" ? 8 : 0;
    const Var out = etc_attention(q, k, v, q_g, labels, segment, 5);
    check_close(out.value(), g.tensor("out"), std::string(name) + ": out");
    backward(out, g.tensor("R"));
    check_close(q.grad(), g.tensor("grad_q"), "grad_q");
    check_close(k.grad(), g.tensor("grad_k"), "grad_k");
    check_close(v.grad(), g.tensor("grad_v"), "grad_v");
    check_close(labels.grad(), g.tensor("grad_labels"), "grad_labels");
    if (segment > 0) check_close(q_g.grad(), g.tensor("grad_q_g"), "grad_q_g");
  }
}

TEST_CASE("etc: gradcheck through the globals and the label biases") {
  const auto f = [](const std::vector<Var>& in) { return etc_attention(in[0], in[1], in[2], in[3], in[4], 3, 2); };
  const GradcheckResult r = gradcheck(f, {normal({1, 2, 11, 3}, 5), normal({1, 2, 11, 3}, 6), normal({1, 2, 11, 3}, 7),
                                          normal({2, 3}, 8), normal({2, 4}, 9, 0.5f)}, "etc");
  CHECK_MESSAGE(r.ok, r.message);
  CHECK_THROWS_AS(etc_attention(Var(normal({1, 2, 11, 3}, 5)), Var(normal({1, 2, 11, 3}, 6)),
                                Var(normal({1, 2, 11, 3}, 7)), Var(normal({2, 3}, 8)), Var(normal({2, 5}, 9)), 3, 2),
                  Error);  // labels for another radius
}

TEST_CASE("etc: a global summarises only a complete earlier segment; generation equals the forward") {
  // Segments of 4, radius 2: token 9 (segment 2) sees globals 0 and 1 and
  // tokens 7-9; a change at token 5 (segment 1, beyond the radius) reaches it
  // only through global 1, a change at token 8 (its own segment) only directly.
  Rng rng(2);
  EtcAttention attn(etc_config(/*segment=*/4, /*radius=*/2), std::make_shared<PositionalLayer>(), rng);
  CHECK(attn.num_parameters() == static_cast<int64_t>(attention_kinds().get("etc").parameters(etc_config(4, 2))));
  attn.eval();
  NoGradGuard no_grad;
  Rng unused(0);
  const Tensor x = normal({1, 14, 8}, 9);
  const Tensor y = attn.forward(Var(x), unused).value();
  const auto moved = [&](int64_t t) {
    Tensor x2 = x.clone();
    x2.at({0, t, 0}) += 1.0f;
    const Tensor y2 = attn.forward(Var(x2), unused).value();
    std::vector<int64_t> changed;
    for (int64_t i = 0; i < 14; ++i)
      if (max_abs_diff(y.slice(1, i, i + 1), y2.slice(1, i, i + 1)) > 0) changed.push_back(i);
    return changed;
  };
  // Token 5: itself and the next two by the window, then every token of segments 2 and 3 through global 1.
  CHECK(moved(5) == std::vector<int64_t>{5, 6, 7, 8, 9, 10, 11, 12, 13});
  // Token 1 with a radius of 2: tokens 1-3 directly, then from segment 1 (token 4) on through global 0.
  CHECK(moved(1) == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
  // Token 13, in the last (incomplete) segment: only itself.
  CHECK(moved(13) == std::vector<int64_t>{13});
  auto state = attn.make_state(1, -1);
  check_close(attn.forward(Var(x.slice(1, 0, 6).contiguous()), *state).value(), y.slice(1, 0, 6).contiguous(),
              "prompt", 1e-6);
  for (int64_t t = 6; t < 14; ++t)
    check_close(attn.forward(Var(x.slice(1, t, t + 1).contiguous()), *state).value(),
                y.slice(1, t, t + 1).contiguous(), "position " + std::to_string(t), 1e-6);
}
