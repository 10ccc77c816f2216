// Routing attention (layers/attention/routing.h): one centroid taking every
// token is full causal shared-QK attention; values and gradients equal a
// PyTorch version of the formula; no gradient reaches an output from a later
// token; generation equals the forward; the centroids move by the EMA of the
// batch statistics, summed alike over data-parallel shards.
#include <doctest/doctest.h>

#include <cmath>

#include "kind_tests.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/routing.h"
#include "tapeformer/train/data_parallel.h"

using namespace tapeformer;
using namespace kind_tests;

namespace {

ModelConfig routing_config(int64_t clusters, int64_t local_heads) {
  ModelConfig c;
  c.block_size = 100;  // two 64-row tiles
  c.n_head = 2;
  c.n_embd = 8;
  c.attention = "routing";
  c.options["routing_clusters"] = clusters;
  c.options["routing_local_heads"] = local_heads;
  return c;
}

// Shared-QK causal attention from primitives: scores q.q / sqrt(D), later keys
// hidden, the own key only for row 0 (it sees no other).
Var full_shared_qk(const Var& q, const Var& v) {
  const int64_t T = q.dim(2);
  std::vector<Scalar> mask(static_cast<size_t>(T * T), 0.0f);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) mask[static_cast<size_t>(i * T + j)] = j > i || (j == i && i > 0) ? 1.0f : 0.0f;
  const Var s = mul_scalar(matmul(q, transpose(q, 2, 3)), 1.0f / std::sqrt(static_cast<float>(q.dim(3))));
  return matmul(softmax(masked_fill(s, Tensor::from({T, T}, mask), -INFINITY)), v);
}

}  // namespace

TEST_CASE("routing: one centroid taking every token is full causal shared-QK attention") {
  Rng rng(4);
  RoutingAttention attn(routing_config(/*clusters=*/1, /*local_heads=*/0), std::make_shared<PositionalLayer>(), rng);
  CHECK(attn.window_for(100) == 100);  // w = ceil(block_size / C): no cap
  CHECK(attn.window_for(7) == 7);
  const Tensor xt = normal({2, 100, 8}, 5);
  Rng unused(0);
  const Var x(xt);
  const Tensor y = attn.forward(x, unused).value();
  const Var qv = attn.qkv->forward(x);
  const auto heads = [&](int64_t c0) { return permute(reshape(slice(qv, 2, c0, c0 + 8), {2, 100, 2, 4}), {0, 2, 1, 3}); };
  const Var ref = attn.proj->forward(merge_heads(full_shared_qk(heads(0), heads(8))));
  check_close(y, ref.value(), "one centroid", 1e-5);
  // All heads local with a window covering the sequence: the same attention.
  Rng same(4);
  ModelConfig local = routing_config(1, 2);
  local.options["routing_local_window"] = int64_t{100};
  RoutingAttention all_local(local, std::make_shared<PositionalLayer>(), same);
  check_close(all_local.forward(x, unused).value(), ref.value(), "one window", 1e-5);
}

TEST_CASE("routing: values and gradients equal PyTorch's formula (a local head, two routed heads, 3 centroids)") {
  const Golden g = reference("routing");
  Var q(g.tensor("q"), true), v(g.tensor("v"), true);
  const Tensor mu = g.tensor("mu");  // (2, 3, 4)
  const int64_t w = 24, r = 5;
  const IndexTensor clusters = routing_clusters(
      div(slice(q, 1, 1, 3), add_scalar(sqrt(sum(mul(slice(q, 1, 1, 3), slice(q, 1, 1, 3)), {-1}, true)), 1e-6f))
          .value(),
      mu, w);
  // Some row is in no cluster and some in several: the mean's every case is exercised.
  std::vector<int> count(2 * 2 * 70, 0);
  for (int64_t bh = 0; bh < 4; ++bh)
    for (int64_t i = 0; i < 72; ++i) ++count[static_cast<size_t>(bh * 70 + clusters.data[static_cast<size_t>(bh * 72 + i)])];
  CHECK(std::count(count.begin(), count.end(), 0) > 0);
  CHECK(std::count_if(count.begin(), count.end(), [](int n) { return n > 1; }) > 0);
  const Var out = concat({local_shared_qk_attention(slice(q, 1, 0, 1), slice(v, 1, 0, 1), r, 0, nullptr),
                          routed_attention(slice(q, 1, 1, 3), slice(v, 1, 1, 3), clusters, w, 0, nullptr)},
                         1);
  check_close(out.value(), g.tensor("out"), "routing: out");
  backward(out, g.tensor("R"));
  check_close(q.grad(), g.tensor("grad_q"), "grad_q");
  check_close(v.grad(), g.tensor("grad_v"), "grad_v");
}

TEST_CASE("routing in training: no gradient reaches an output from a later token; generation equals the forward") {
  // Whether a token is among a centroid's top w depends on later tokens (a
  // discrete choice), so routing is not in the strict causality probe; the
  // gradient of y_i with respect to every later input is exactly zero.
  Rng init(6);
  RoutingAttention attn(routing_config(/*clusters=*/3, /*local_heads=*/1), std::make_shared<PositionalLayer>(), init);
  const Tensor xt = normal({2, 100, 8}, 7);
  for (const int64_t i : {0, 37, 98}) {
    CAPTURE(i);
    const GradientSplit g = gradient_around(attn, xt, i, 8);
    CHECK(g.later == 0.0);
    CHECK(g.earlier > 0.0);
  }
  attn.zero_statistics();
  attn.eval();
  NoGradGuard no_grad;
  Rng unused(0);
  // Each piece's rows are those of the forward over the tokens so far (w = ceil(100 / 3) = 34 throughout).
  CHECK(attn.window_for(40) == 34);
  const Tensor row = xt.slice(0, 0, 1);
  const auto prefix = [&](int64_t t) { return attn.forward(Var(row.slice(1, 0, t).contiguous()), unused).value(); };
  auto state = attn.make_state(1, -1);
  check_close(attn.forward(Var(row.slice(1, 0, 40).contiguous()), *state).value(), prefix(40), "prompt", 0.0);
  for (int64_t t = 40; t < 45; ++t)
    check_close(attn.forward(Var(row.slice(1, t, t + 1).contiguous()), *state).value(),
                prefix(t + 1).slice(1, t, t + 1).contiguous(), "position " + std::to_string(t), 0.0);
  CHECK(max_abs_diff(prefix(45).slice(1, 0, 40), prefix(40)) > 1e-4);  // later tokens moved earlier rows' clusters
  for (const auto& [name, s] : attn.statistics()) CHECK(max_abs_diff(s, Tensor::zeros(s.shape())) == 0.0);  // eval adds nothing
}

TEST_CASE("routing: centroids move by the EMA of the routed unit queries; decay 1 freezes them") {
  Rng rng(9);
  ModelConfig cfg = routing_config(/*clusters=*/2, /*local_heads=*/0);
  cfg.block_size = 30;  // w = 15
  cfg.options["routing_decay"] = 0.5;
  RoutingAttention attn(cfg, std::make_shared<PositionalLayer>(), rng);
  const Tensor before = attn.centroids.clone();  // (2, 2, 4)
  const Tensor xt = normal({2, 30, 8}, 10);
  Rng step(1);
  TapeScope tape;
  attn.forward(Var(xt), step);
  // The expected sums from the same clusters, recomputed here.
  const Var q = permute(reshape(slice(attn.qkv->forward(Var(xt)), 2, 0, 8), {2, 30, 2, 4}), {0, 2, 1, 3});
  const Tensor unit = div(q, add_scalar(sqrt(sum(mul(q, q), {-1}, true)), 1e-6f)).value().contiguous();
  const IndexTensor clusters = routing_clusters(unit, before, attn.window_for(30));
  CHECK(attn.sums.at({0, 0, 4}) + attn.sums.at({0, 1, 4}) == 2 * 30);  // w = 15 tokens per centroid, 2 rows
  CHECK(attn.optimizer_stepped(1));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t c = 0; c < 2; ++c) {
      std::vector<double> s(4, 0.0);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t r = c * 15; r < c * 15 + 15; ++r)
          for (int64_t d = 0; d < 4; ++d)
            s[d] += unit.at({b, h, clusters.data[static_cast<size_t>((b * 2 + h) * 30 + r)], d});
      const double sn = std::sqrt(s[0] * s[0] + s[1] * s[1] + s[2] * s[2] + s[3] * s[3]);
      std::vector<double> m(4);
      double mn = 0;
      for (int64_t d = 0; d < 4; ++d) m[d] = 0.5 * before.at({h, c, d}) + 0.5 * s[d] / sn, mn += m[d] * m[d];
      for (int64_t d = 0; d < 4; ++d) CHECK(attn.centroids.at({h, c, d}) == doctest::Approx(m[d] / std::sqrt(mn)).epsilon(1e-5));
    }
  for (const auto& [name, s] : attn.statistics()) CHECK(max_abs_diff(s, Tensor::zeros(s.shape())) == 0.0);
  CHECK_FALSE(attn.optimizer_stepped(2));  // nothing routed since

  cfg.options["routing_decay"] = 1.0;
  Rng same(9);
  RoutingAttention frozen(cfg, std::make_shared<PositionalLayer>(), same);
  frozen.forward(Var(xt), step);
  CHECK_FALSE(frozen.optimizer_stepped(1));
  CHECK(max_abs_diff(frozen.centroids, before) == 0.0);
  CHECK_THROWS_WITH_AS(RoutingAttention(routing_config(0, 0), std::make_shared<PositionalLayer>(), same),
                       doctest::Contains("model.routing_clusters must be >= 1"), Error);
}

TEST_CASE("routing: data-parallel shards sum their statistics before the centroids move") {
  ModelConfig cfg = routing_config(/*clusters=*/2, /*local_heads=*/1);
  cfg.n_layer = 1;
  cfg.block_size = 16;
  cfg.vocab_size = 11;
  cfg.options["routing_decay"] = 0.5;
  Batch batch;
  std::vector<int32_t> ids(4 * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7 + i / 5) % 11);
  batch.inputs = batch.targets = IndexTensor({4, 16}, ids);
  const auto centroids_of = [](const LanguageModel& m) {
    for (const auto& [name, t] : m.state())
      if (name.find("centroids") != std::string::npos) return t.clone();
    FAIL("no centroids in the state");
    return Tensor();
  };
  std::vector<Tensor> moved;
  Tensor initial;
  for (const int shards : {1, 2, 4}) {
    Rng init(3);
    std::unique_ptr<LanguageModel> model = make_model(cfg, init);
    initial = centroids_of(*model);
    DataParallel dp(*model, shards);
    Rng dropout(1);
    dp.train_batch(batch, 1.0f, dropout);
    dp.optimizer_stepped(1);
    moved.push_back(centroids_of(*model));
  }
  CHECK(max_abs_diff(moved[0], initial) > 1e-3);  // the step moved them
  CHECK(max_abs_diff(moved[0], moved[1]) < 1e-6);  // ... by the whole batch's sums, however it was split
  CHECK(max_abs_diff(moved[0], moved[2]) < 1e-6);
}
