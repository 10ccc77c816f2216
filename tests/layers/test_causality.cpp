// Causality is one field of an attention kind (AttentionKind::causality):
// a config asking for what a kind cannot do is refused, and softmax serves
// a bidirectional model (ModelConfig::causal = false) with the same op.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/softmax.h"

using namespace tapeformer;

namespace {

ModelConfig small_config(const std::string& attention, bool causal) {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 8;
  c.attention = attention;
  c.causal = causal;
  return c;
}

Tensor random(const Shape& s, uint64_t seed) {
  Tensor t = Tensor::empty(s);
  Rng(seed).fill_normal(t, 0.0f, 1.0f);
  return t;
}

}  // namespace

TEST_CASE("causality: every kind declares what it serves; configs asking for more are refused") {
  for (const AttentionKind& k : attention_kinds().kinds()) {
    CAPTURE(k.name);
    CHECK((serves(k.causality, true) || serves(k.causality, false)));
    for (bool causal : {true, false}) {
      ModelConfig c = small_config(k.name, causal);
      if (serves(k.causality, causal)) continue;
      CHECK_THROWS_AS(c.validate_kinds(), Error);
    }
  }
  CHECK(attention_kinds().get("softmax").causality == Causality::either);
  CHECK(attention_kinds().get("linformer").causality == Causality::bidirectional);
  CHECK(attention_kinds().get("lsh").causality == Causality::chunk_dependent);
  CHECK_THROWS_WITH_AS(small_config("linear", false).validate_kinds(),
                       "model.attention \"linear\" is strictly causal: it cannot serve a bidirectional model "
                       "(ModelConfig::causal = false)",
                       Error);
  CHECK_THROWS_WITH_AS(small_config("lsh", false).validate_kinds(),
                       "model.attention \"lsh\" is causal, chunk-dependent: it cannot serve a bidirectional model "
                       "(ModelConfig::causal = false)",
                       Error);
  ModelConfig memory = small_config("softmax", false);
  memory.options["mem_len"] = int64_t{4};
  CHECK_THROWS_WITH_AS(memory.validate_kinds(), "model.mem_len = 4 needs a causal model (ModelConfig::causal)", Error);
}

TEST_CASE("causality: bidirectional softmax attention is softmax(q k^T / sqrt(D)) v over every key") {
  for (bool causal : {true, false}) {
    CAPTURE(causal);
    const ModelConfig c = small_config("softmax", causal);
    Rng rng(3);
    const auto attn = std::dynamic_pointer_cast<MultiHeadAttention>(
        attention_kinds().get("softmax").make(c, std::make_shared<PositionalLayer>(), rng));
    REQUIRE(attn != nullptr);
    const Tensor x = random({2, 6, 8}, 4);
    Rng unused(0);
    const Tensor got = attn->forward(Var(x), unused).value();
    // The formula, written out: heads of D = 4, the future masked only when causal.
    const std::vector<Var> h = split_heads(attn->qkv->forward(Var(x)), 2);  // (B, H, T, D)
    Var scores = mul_scalar(matmul(h[0], transpose(h[1], 2, 3)), 0.5f);      // 1 / sqrt(4)
    if (causal) {
      Tensor future = Tensor::zeros({6, 6});
      for (int64_t i = 0; i < 6; ++i)
        for (int64_t j = i + 1; j < 6; ++j) future.data()[i * 6 + j] = 1;
      scores = masked_fill(scores, future, -INFINITY);
    }
    const Tensor want = attn->proj->forward(merge_heads(matmul(softmax(scores), h[2]))).value();
    const auto g = got.to_vector(), w = want.to_vector();
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(double(g[i]) - w[i]));
    CHECK(worst < 1e-5);
    // The first position's output moves with the last input only when bidirectional.
    Tensor x2 = x.clone();
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t ch = 0; ch < 8; ++ch) x2.data()[(b * 6 + 5) * 8 + ch] += 1.0f;
    const Tensor moved = attn->forward(Var(x2), unused).value();
    double first_row_change = 0;
    for (int64_t ch = 0; ch < 8; ++ch)
      first_row_change = std::max(first_row_change, double(std::abs(moved.data()[ch] - got.data()[ch])));
    if (causal) CHECK(first_row_change == 0.0);
    else CHECK(first_row_change > 1e-3);
    if (!causal) CHECK_THROWS_AS(attn->make_state(1, 8), Error);
  }
}
