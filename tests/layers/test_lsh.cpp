// LSH attention (layers/attention/lsh.h): with one chunk it is full shared-QK
// attention with Reformer's self rule; generation equals the window's forward.
#include <doctest/doctest.h>

#include <cmath>

#include "tapeformer/core/error.h"
#include "golden.h"
#include "kind_tests.h"
#include "tapeformer/layers/attention/lsh.h"

using namespace tapeformer;

namespace {

ModelConfig lsh_config(int64_t chunk, int64_t buckets, int64_t hashes) {
  ModelConfig c;
  c.block_size = 100;  // two 64-row tiles: a chunk spans tiles, and sees keys sorted after its queries
  c.n_head = 2;
  c.n_embd = 8;
  c.attention = "lsh";
  c.options["lsh_chunk"] = chunk;
  c.options["lsh_buckets"] = buckets;
  c.options["lsh_hashes"] = hashes;
  return c;
}

}  // namespace

TEST_CASE("LSH attention with one chunk is full shared-QK attention: unit keys, causal, self only when alone") {
  for (const int64_t hashes : {1, 3}) {
    CAPTURE(hashes);
    Rng rng(4);
    LSHAttention attn(lsh_config(/*chunk=*/128, /*buckets=*/4, hashes), std::make_shared<PositionalLayer>(), rng);
    attn.eval();
    Tensor xt = Tensor::empty({2, 100, 8});
    rng.fill_normal(xt, 0.0f, 1.0f);
    NoGradGuard no_grad;
    const Var x(xt);
    const Tensor y = attn.forward(x, rng).value();
    // The reference from primitives: q, k = q / |q|, scores q.k / sqrt(D), future -inf, self -inf but for row 0.
    const Var qv = attn.qkv->forward(x);
    const auto heads = [&](int64_t c0) { return permute(reshape(slice(qv, 2, c0, c0 + 8), {2, 100, 2, 4}), {0, 2, 1, 3}); };
    const Var q = heads(0), v = heads(8);
    const Var k = div(q, add_scalar(sqrt(sum(mul(q, q), {-1}, true)), 1e-6f));
    std::vector<Scalar> mask(100 * 100, 0.0f);
    for (int64_t i = 0; i < 100; ++i)
      for (int64_t j = 0; j < 100; ++j) mask[i * 100 + j] = j > i || (j == i && i > 0) ? 1.0f : 0.0f;
    Var s = mul_scalar(matmul(q, transpose(k, 2, 3)), 0.5f);  // 1 / sqrt(4)
    s = masked_fill(s, Tensor::from({100, 100}, mask), -INFINITY);
    const Var ref = attn.proj->forward(merge_heads(matmul(softmax(s), v)));
    check_close(y, ref.value(), "one chunk", 1e-5);
  }
}

TEST_CASE("LSH attention with small chunks: generation re-runs the window and equals the forward; bad options refused") {
  Rng rng(5);
  LSHAttention attn(lsh_config(/*chunk=*/4, /*buckets=*/4, /*hashes=*/2), std::make_shared<PositionalLayer>(), rng);
  attn.eval();
  Tensor xt = Tensor::empty({1, 100, 8});
  rng.fill_normal(xt, 0.0f, 1.0f);
  NoGradGuard no_grad;
  const Tensor y = attn.forward(Var(xt), rng).value();
  // (No value after a query's position reaches it: PositionMask hides by positions, tested with rows
  // shuffled per head in tests/autograd/test_sparse_attention.cpp. Which chunk a query lands in does depend on
  // later tokens' hashes, so LSH attention is not in the strict causality probe.)
  // Generation: the state re-runs the window, so feeding the whole sequence at once gives the same rows.
  auto state = attn.make_state(1, -1);
  check_close(attn.forward(Var(xt), *state).value(), y, "window", 1e-6);
  CHECK(state->length() == 100);
  // A changed chunk (E3d evaluates with other chunks) is used, not the tiles of the old one.
  attn.chunk = 128;
  Rng same(5);
  LSHAttention one_chunk(lsh_config(/*chunk=*/128, /*buckets=*/4, /*hashes=*/2), std::make_shared<PositionalLayer>(), same);
  one_chunk.eval();
  check_close(attn.forward(Var(xt), rng).value(), one_chunk.forward(Var(xt), rng).value(), "chunk changed", 0.0);
  CHECK(attn.forward(Var(xt), rng).value().to_vector() != y.to_vector());
  CHECK_THROWS_WITH_AS(LSHAttention(lsh_config(4, 3, 1), std::make_shared<PositionalLayer>(), rng),
                       doctest::Contains("model.lsh_buckets must be even"), Error);
}

TEST_CASE("LSH attention in training: no gradient reaches a query from a later token, and no later value is read") {
  // A later token moves a query's chunk only through where it hashes (a
  // discrete choice), so the gradient of y_i with respect to every later
  // input is exactly zero: training cannot learn to use that dependence.
  Rng init(6);
  LSHAttention attn(lsh_config(/*chunk=*/4, /*buckets=*/4, /*hashes=*/2), std::make_shared<PositionalLayer>(), init);
  Tensor xt = Tensor::empty({2, 100, 8});
  init.fill_normal(xt, 0.0f, 1.0f);
  for (const int64_t i : {0, 37, 98}) {
    CAPTURE(i);
    const kind_tests::GradientSplit g = kind_tests::gradient_around(attn, xt, i, 8);  // seed 8: the step's rotations
    CHECK(g.later == 0.0);
    CHECK(g.earlier > 0.0);
  }
}
