// Linformer (layers/attention/linformer.h): the layer equals its formula
// composed from primitive ops, its parameters are what its kind counts, it
// is refused by causal models, and it is indeed not causal.
#include <doctest/doctest.h>

#include <cmath>

#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/core/error.h"
#include "golden.h"
#include "tapeformer/layers/attention/linformer.h"
#include "tapeformer/layers/attention/softmax.h"

using namespace tapeformer;

namespace {

ModelConfig encoder_config(const std::string& sharing) {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 20;
  c.n_head = 2;
  c.n_embd = 8;
  c.causal = false;
  c.attention = "linformer";
  c.options["linformer_k"] = int64_t{5};
  c.options["linformer_sharing"] = sharing;
  return c;
}

}  // namespace

TEST_CASE("linformer: softmax(q (E_T k)^T / sqrt(D)) F_T v per head, for each sharing, and its parameter count") {
  for (const std::string sharing : {"headwise", "kv", "none"}) {
    CAPTURE(sharing);
    const ModelConfig c = encoder_config(sharing);
    c.validate_kinds();
    Rng rng(4);
    LinformerAttention attn(c, std::make_shared<PositionalLayer>(), rng);
    CHECK(static_cast<double>(attn.num_parameters()) == attention_kinds().get("linformer").parameters(c));
    CHECK((sharing == "kv") == (attn.E.value().data() == attn.F.value().data()));
    attn.eval();
    Tensor xt = Tensor::empty({2, 13, 8});  // T = 13 < n = 20: the projections' first 13 columns
    rng.fill_normal(xt, 0.0f, 1.0f);
    const Var x(xt);
    const Var y = attn.forward(x, rng);
    // The same from primitives.
    const std::vector<Var> h = split_heads(attn.qkv->forward(x), 2);  // (B, H, T, D)
    const auto proj = [&](const Var& P, const Var& v) {
      const Var PT = slice(P, P.rank() - 1, 0, 13);
      return matmul(P.rank() == 3 ? reshape(PT, {1, 2, 5, 13}) : PT, v);  // (B, H, k, D)
    };
    const Var ref = attn.proj->forward(
        merge_heads(scaled_dot_product_attention(h[0], proj(attn.E, h[1]), proj(attn.F, h[2]), false, 0.0f, nullptr)));
    check_close(y.value(), ref.value(), "output", 1e-5);
  }
}

TEST_CASE("linformer: the input gradient passes a gradient check (E and F reach theirs through matmul, gradchecked)") {
  const ModelConfig c = encoder_config("headwise");
  Rng rng(8);
  LinformerAttention attn(c, std::make_shared<PositionalLayer>(), rng);
  attn.eval();
  Tensor xt = Tensor::empty({1, 7, 8});
  rng.fill_normal(xt, 0.0f, 1.0f);
  const auto report = gradcheck([&](const std::vector<Var>& in) { return attn.forward(in[0], rng); }, {xt});
  CHECK_MESSAGE(report.ok, report.message);
}

TEST_CASE("linformer is refused by a causal model, and is indeed not causal") {
  ModelConfig lm = encoder_config("headwise");
  lm.causal = true;
  CHECK_THROWS_WITH_AS(lm.validate_kinds(), doctest::Contains("model.attention \"linformer\" is not causal"), Error);
  const ModelConfig c = encoder_config("headwise");
  Rng rng(2);
  LinformerAttention attn(c, std::make_shared<PositionalLayer>(), rng);
  attn.eval();
  Tensor xt = Tensor::empty({1, 10, 8});
  rng.fill_normal(xt, 0.0f, 1.0f);
  NoGradGuard no_grad;
  const Tensor before = attn.forward(Var(xt), rng).value().clone();
  xt.at({0, 9, 3}) += 1.0f;  // the last position changes ...
  const Tensor after = attn.forward(Var(xt), rng).value();
  CHECK(std::abs(after.at({0, 0, 0}) - before.at({0, 0, 0})) > 1e-6f);  // ... and so does the first one's output
  CHECK_THROWS_WITH_AS(attn.make_state(1, -1), doctest::Contains("is not causal"), Error);
  CHECK_THROWS_WITH_AS(attn.forward(Var(Tensor::zeros({1, 21, 8})), rng),
                       doctest::Contains("21 positions exceed the projections' length n = 20"), Error);
}
