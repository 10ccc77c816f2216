// Sparse Sinkhorn attention (layers/attention/sinkhorn.h): one block is full
// attention (causal and not); values and gradients equal a PyTorch version
// of the formula; gradcheck through the sorting network over several
// blocks; Gumbel noise only in training; generation equals the forward.
#include <doctest/doctest.h>

#include <cmath>

#include "kind_tests.h"
#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/sinkhorn.h"

using namespace tapeformer;
using namespace kind_tests;

namespace {

ModelConfig sinkhorn_config() {
  ModelConfig c;
  c.block_size = 24;
  c.n_head = 2;
  c.n_embd = 8;
  c.attention = "sinkhorn";
  c.options["sinkhorn_block"] = int64_t{4};
  c.options["sinkhorn_temperature"] = 0.75;
  c.options["sinkhorn_iters"] = int64_t{7};
  return c;
}

}  // namespace

TEST_CASE("sinkhorn: one block covering the sequence is full attention, causal and bidirectional") {
  const Tensor q = normal({2, 2, 9, 4}, 1), k = normal({2, 2, 9, 4}, 2), v = normal({2, 2, 9, 4}, 3);
  const Var w(normal({8, 1}, 4));
  for (const bool causal : {true, false}) {
    INFO("causal " << causal);
    SinkhornOptions o;
    o.block = causal ? 16 : 9;  // one block: causal, of 16 over 9 positions (7 padded, hidden)
    o.causal = causal;
    AttentionSpec spec;
    spec.causal = causal;
    const Tensor full = softmax_attention(Var(q), Var(k), Var(v), spec).value();
    // Bidirectional: the keys are [K; K], each twice in numerator and denominator alike.
    check_close(sinkhorn_attention(Var(q), Var(k), Var(v), w, o).value(), full, "one block", 1e-6);
  }
}

TEST_CASE("sinkhorn: values and gradients equal PyTorch's formula (causal, and bidirectional with 3 iterations)") {
  for (const char* name : {"sinkhorn_causal", "sinkhorn"}) {
    INFO(name);
    const Golden g = reference(name);
    SinkhornOptions o;
    o.block = 4;
    o.iters = 3;
    o.causal = std::string(name) == "sinkhorn_causal";
    Var q(g.tensor("q"), true), k(g.tensor("k"), true), v(g.tensor("v"), true), w(g.tensor("w_p"), true);
    const Var out = sinkhorn_attention(q, k, v, w, o);
    check_close(out.value(), g.tensor("out"), std::string(name) + ": out");
    backward(out, g.tensor("R"));
    check_close(q.grad(), g.tensor("grad_q"), "grad_q");
    check_close(k.grad(), g.tensor("grad_k"), "grad_k");
    check_close(v.grad(), g.tensor("grad_v"), "grad_v");
    check_close(w.grad(), g.tensor("grad_w_p"), "grad_w_p");
  }
}

TEST_CASE("sinkhorn: gradcheck through the sorting network over four blocks") {
  for (const bool causal : {true, false}) {
    INFO("causal " << causal);
    SinkhornOptions o;
    o.block = 3;
    o.iters = 2;
    o.causal = causal;
    const auto f = [o](const std::vector<Var>& in) { return sinkhorn_attention(in[0], in[1], in[2], in[3], o); };
    const int64_t T = causal ? 11 : 12;
    const GradcheckResult r = gradcheck(f, {normal({1, 2, T, 3}, 5), normal({1, 2, T, 3}, 6),
                                            normal({1, 2, T, 3}, 7), normal({6, 4}, 8, 0.5f)}, "sinkhorn");
    CHECK_MESSAGE(r.ok, r.message);
  }
  SinkhornOptions encoder;
  encoder.block = 4;
  encoder.causal = false;
  const Tensor odd = normal({1, 1, 10, 3}, 9);
  CHECK_THROWS_AS(sinkhorn_attention(Var(odd), Var(odd), Var(odd), Var(normal({6, 3}, 10)), encoder), Error);
}

TEST_CASE("sinkhorn: Gumbel noise in training only; generation re-runs the window and equals the forward") {
  Rng rng(2);
  SinkhornAttention attn(sinkhorn_config(), std::make_shared<PositionalLayer>(), rng);
  CHECK(attn.num_parameters() ==
        static_cast<int64_t>(attention_kinds().get("sinkhorn").parameters(sinkhorn_config())));
  const Tensor x = normal({1, 22, 8}, 9, 20.0f);
  Rng r1(1), r2(2);
  const Tensor a = attn.forward(Var(x), r1).value(), b = attn.forward(Var(x), r2).value();
  CHECK(max_abs_diff(a, b) > 1e-5);  // different noise, different sorting
  attn.eval();
  NoGradGuard no_grad;
  const Tensor whole = attn.forward(Var(x), r1).value();
  CHECK(max_abs_diff(attn.forward(Var(x), r2).value(), whole) == 0.0);
  auto state = attn.make_state(1, -1);
  check_close(attn.forward(Var(x.slice(1, 0, 9).contiguous()), *state).value(), whole.slice(1, 0, 9).contiguous(),
              "prompt", 1e-5);
  for (int64_t t = 9; t < 22; ++t)
    check_close(attn.forward(Var(x.slice(1, t, t + 1).contiguous()), *state).value(),
                whole.slice(1, t, t + 1).contiguous(), "position " + std::to_string(t), 1e-5);
  CHECK_THROWS_AS(attn.forward(Var(normal({1, 25, 8}, 10)), r1), Error);  // more blocks than W_P has
}
