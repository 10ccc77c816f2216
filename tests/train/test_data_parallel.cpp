// DataParallel: sharded forward + backward gives the unsharded gradients, and
// the result does not depend on the thread count.
#include <doctest/doctest.h>

#include <cmath>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/train/data_parallel.h"
#include "tapeformer/train/shard_tree.h"
#include "memory_models.h"

using namespace tapeformer;
using memory_models::group_of;
using memory_models::held;

namespace {

ModelConfig small_config(float dropout = 0.0f) {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = dropout;
  return c;
}

Batch random_batch(int64_t B, int64_t T, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> x(B * T), y(B * T);
  for (auto& v : x) v = static_cast<int32_t>(rng.below(11));
  for (auto& v : y) v = static_cast<int32_t>(rng.below(11));
  return {IndexTensor({B, T}, x), IndexTensor({B, T}, y), {}, {}};
}

// Gradients of scale * loss(batch) computed with `shards` shards.
std::pair<double, NamedTensors> sharded_grads(int shards, const Batch& batch, float scale = 1.0f) {
  Rng init(3);
  TransformerLM model(small_config(), init);
  DataParallel dp(model, shards);
  Rng dropout(9);
  const double loss = dp.train_batch(batch, scale, dropout);
  NamedTensors grads;
  for (const auto& [name, p] : model.named_parameters()) grads.emplace_back(name, p.grad().clone());
  return {loss, grads};
}

void check_close(const NamedTensors& a, const NamedTensors& b, float tol) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].second.to_vector(), y = b[i].second.to_vector();
    REQUIRE(x.size() == y.size());
    float worst = 0, scale = 0;
    for (size_t j = 0; j < x.size(); ++j) {
      const float d = std::abs(x[j] - y[j]);
      if (std::isnan(d) || d > worst) worst = d;  // a NaN stays the worst and fails the check
      scale = std::max(scale, std::abs(y[j]));
    }
    INFO(a[i].first << ": max |diff| " << worst << " vs max |grad| " << scale);
    CHECK(worst <= tol * scale);
  }
}

}  // namespace

TEST_CASE("DataParallel: 2 and 3 shards give the unsharded loss and gradients (uneven split too)") {
  const Batch batch = random_batch(5, 8, 1);
  const auto [loss1, g1] = sharded_grads(1, batch, 0.5f);
  for (int shards : {2, 3, 5}) {
    CAPTURE(shards);
    const auto [loss, g] = sharded_grads(shards, batch, 0.5f);
    CHECK(loss == doctest::Approx(loss1).epsilon(1e-6));
    check_close(g, g1, 1e-5f);
  }
}

TEST_CASE("DataParallel: with ignored targets, shards are weighted by their counted targets (the unsharded mean)") {
  // Row 0 counts 7 targets, the others 1 each: weighting shards by rows would
  // give row 0 a third of the gradient instead of 7/11.
  Batch batch = random_batch(5, 8, 6);
  for (int64_t b = 1; b < 5; ++b)
    for (int64_t t = 0; t < 8; ++t)
      if (t != b) batch.targets.data[static_cast<size_t>(b * 8 + t)] = kIgnoreTarget;
  batch.targets.data[0] = kIgnoreTarget;
  const auto [loss1, g1] = sharded_grads(1, batch);
  for (int shards : {2, 3}) {
    CAPTURE(shards);
    const auto [loss, g] = sharded_grads(shards, batch);
    CHECK(loss == doctest::Approx(loss1).epsilon(1e-6));
    check_close(g, g1, 1e-5f);
  }
}

TEST_CASE("DataParallel: a model reads the batch's targets; its loss of them is the whole batch's on any shards") {
  // An early-exit model's auxiliary loss needs the targets (ModelContext::targets;
  // tests/layers/test_early_exit.cpp checks its value): 2 or 3 shards give 1 shard's gradients.
  ModelConfig cfg = small_config();
  cfg.arch = "early_exit";
  cfg.options["exit_heads"] = std::string("per_layer");
  const Batch batch = random_batch(5, 8, 4);
  const auto grads = [&](int shards) {
    Rng init(3);
    std::unique_ptr<LanguageModel> model = make_model(cfg, init);
    DataParallel dp(*model, shards);
    Rng dropout(9);
    dp.train_batch(batch, 1.0f, dropout);
    NamedTensors g;
    for (const auto& [name, p] : model->named_parameters()) g.emplace_back(name, p.grad().clone());
    return g;
  };
  const NamedTensors one = grads(1);
  for (int shards : {2, 3}) {
    CAPTURE(shards);
    check_close(grads(shards), one, 1e-5f);
  }
  // The exit head's gradient is there only because the targets reached the model.
  bool exit_grad = false;
  for (const auto& [name, g] : one)
    if (name.rfind("exit_head_1", 0) == 0)
      for (float v : g.to_vector()) exit_grad = exit_grad || v != 0;
  CHECK(exit_grad);
}

TEST_CASE("DataParallel: the gradient scale is applied exactly (halving the scale halves every gradient)") {
  const Batch batch = random_batch(4, 8, 2);
  const auto [l1, g_full] = sharded_grads(2, batch, 1.0f);
  const auto [l2, g_half] = sharded_grads(2, batch, 0.5f);
  size_t off = 0;
  for (size_t i = 0; i < g_full.size(); ++i) {
    const auto a = g_full[i].second.to_vector(), b = g_half[i].second.to_vector();
    for (size_t j = 0; j < a.size(); ++j) off += !(std::abs(a[j] - 2 * b[j]) <= 1e-6f * std::abs(a[j]) + 1e-9f);  // NaN counts
  }
  CHECK(off == 0);
  CHECK(l1 == l2);
}

TEST_CASE("DataParallel: results are bitwise identical on 1 and 2 threads for a given shard count") {
  const Batch batch = random_batch(6, 8, 3);
  const int before = parallel::num_threads();
  parallel::set_num_threads(1);
  const auto [loss_a, g_a] = sharded_grads(2, batch);
  parallel::set_num_threads(2);
  const auto [loss_b, g_b] = sharded_grads(2, batch);
  parallel::set_num_threads(before);
  CHECK(loss_a == loss_b);
  for (size_t i = 0; i < g_a.size(); ++i) {
    const std::string& name = g_a[i].first;  // INFO's lambda cannot take a binding (C++17)
    INFO(name);
    CHECK(g_a[i].second.to_vector() == g_b[i].second.to_vector());
  }
}

TEST_CASE("DataParallel: replicas follow in-place updates and leave no gradients behind") {
  Rng init(4);
  TransformerLM model(small_config(), init);
  DataParallel dp(model, 2);
  const Batch batch = random_batch(4, 8, 5);
  Rng dropout(1);
  const double before = dp.train_batch(batch, 1.0f, dropout);
  // A plain SGD step through the model's parameters; the replica must see it.
  for (const Var& p : model.parameters()) {
    Tensor v = p.value();
    const auto g = p.grad().to_vector();
    auto w = v.to_vector();
    for (size_t j = 0; j < w.size(); ++j) w[j] -= 0.5f * g[j];
    v.copy_from(Tensor::from(v.shape(), w));
    p.zero_grad();
  }
  const double after = dp.train_batch(batch, 1.0f, dropout);
  CHECK(after < before - 0.01);
  // Same loss as an unsharded evaluation of the updated model.
  NoGradGuard no_grad;
  Rng unused(0);
  CHECK(after == doctest::Approx(cross_entropy(model.forward(batch.inputs, unused), batch.targets).item()).epsilon(1e-6));
}

TEST_CASE("DataParallel: dropout shards are reproducible, and losses() matches serial evaluation") {
  Rng init_a(6), init_b(6);
  TransformerLM a(small_config(0.3f), init_a), b(small_config(0.3f), init_b);
  DataParallel dpa(a, 2), dpb(b, 2);
  const Batch batch = random_batch(4, 8, 7);
  Rng ra(11), rb(11);
  CHECK(dpa.train_batch(batch, 1.0f, ra) == dpb.train_batch(batch, 1.0f, rb));
  CHECK(ra.next_u64() == rb.next_u64());

  const std::vector<Batch> batches = {random_batch(3, 8, 20), random_batch(3, 8, 21), random_batch(3, 8, 22)};
  Rng r(0);
  CHECK_THROWS_WITH_AS(dpa.losses(batches, r), doctest::Contains("eval mode"), Error);
  a.eval();
  const std::vector<double> got = dpa.losses(batches, r);
  NoGradGuard no_grad;
  for (size_t i = 0; i < batches.size(); ++i)
    CHECK(got[i] == cross_entropy(a.forward(batches[i].inputs, r), batches[i].targets).item());
}

TEST_CASE("alias_parameters: mismatched models are rejected with the parameter named") {
  Rng init(1);
  TransformerLM a(small_config(), init);
  ModelConfig wider = small_config();
  wider.n_embd = 32;
  TransformerLM b(wider, init);
  CHECK_THROWS_WITH_AS(b.alias_parameters(a), doctest::Contains("'tok_emb.weight' has shape [11, 32] here but [11, 16]"),
                       Error);
  ModelConfig deeper = small_config();
  deeper.n_layer = 3;
  TransformerLM c(deeper, init);
  CHECK_THROWS_WITH_AS(c.alias_parameters(a), doctest::Contains("alias_parameters: parameter"), Error);
  CHECK_THROWS_WITH_AS(a.alias_parameters(a), doctest::Contains("cannot alias itself"), Error);
  CHECK_THROWS_WITH_AS(DataParallel(a, 0), doctest::Contains("shards must be >= 1"), Error);
}

TEST_CASE("DataParallel with a segment memory: shards read and update their rows; 2 shards equal 1") {
  const auto run = [](int shards) {
    ModelConfig c = small_config();
    c.positional = "txl";
    c.options["mem_len"] = int64_t{8};
    c.options["cmem_len"] = int64_t{4};  // and a compressed memory, whose rows are sharded too
    Rng init(3);
    TransformerLM model(c, init);
    DataParallel dp(model, shards);
    Rng dropout(9);
    SegmentMemory memory;
    {
      NoGradGuard no_grad;
      dp.train_batch(random_batch(5, 8, 1), 1.0f, dropout, &memory);  // fills the memory, no gradients
    }
    CHECK(held(memory, "layers") == 8);
    CHECK(held(memory, "compressed") == 0);
    {
      NoGradGuard no_grad;
      dp.train_batch(random_batch(5, 8, 4), 1.0f, dropout, &memory);  // 8 rows fall out: 4 compressed rows
    }
    CHECK(held(memory, "compressed") == 4);
    const double loss = dp.train_batch(random_batch(5, 8, 2), 1.0f, dropout, &memory);
    NamedTensors grads;
    for (const auto& [name, p] : model.named_parameters()) grads.emplace_back(name, p.grad().clone());
    return std::make_tuple(loss, grads, memory);
  };
  const auto [loss1, grads1, mem1] = run(1);
  const auto [loss2, grads2, mem2] = run(2);
  CHECK(loss2 == doctest::Approx(loss1).epsilon(1e-6));
  check_close(grads2, grads1, 1e-5f);
  REQUIRE(group_of(mem1, "layers").size() == group_of(mem2, "layers").size());
  for (size_t l = 0; l < group_of(mem1, "layers").size(); ++l) {
    REQUIRE(group_of(mem2, "layers")[l].shape() == Shape({5, 8, 16}));
    const auto a = group_of(mem1, "layers")[l].to_vector(), b = group_of(mem2, "layers")[l].to_vector();
    for (size_t i = 0; i < a.size(); ++i) REQUIRE(b[i] == doctest::Approx(a[i]).epsilon(1e-5));
  }
  REQUIRE(group_of(mem1, "compressed").size() == group_of(mem2, "compressed").size());
  for (size_t l = 0; l < group_of(mem1, "compressed").size(); ++l) {
    REQUIRE(group_of(mem2, "compressed")[l].shape() == Shape({5, 4, 16}));
    const auto a = group_of(mem1, "compressed")[l].to_vector(), b = group_of(mem2, "compressed")[l].to_vector();
    for (size_t i = 0; i < a.size(); ++i) REQUIRE(b[i] == doctest::Approx(a[i]).epsilon(1e-5));
  }
}

TEST_CASE("DataParallel: a layer's buffer change after an optimizer step reaches the replicas (FAVOR+ redraws)") {
  // The replicas run shards 1.. with their own buffers: if a redraw did not reach
  // them, the sharded loss would leave the unsharded one.
  ModelConfig c = small_config();
  c.attention = "linear";
  c.options["feature_map"] = std::string("favor");
  c.options["n_features"] = int64_t{8};
  c.options["feature_redraw"] = int64_t{2};
  const Batch batch = random_batch(4, 8, 5);
  Rng init(3);
  TransformerLM model(c, init);
  DataParallel dp(model, 3);
  const auto losses = [&] {
    NoGradGuard no_grad;
    Rng unused(1);
    DataParallel one(model, 1);
    return std::pair<double, double>{dp.train_batch(batch, 1.0f, unused), one.train_batch(batch, 1.0f, unused)};
  };
  const auto [sharded0, whole0] = losses();
  CHECK(sharded0 == doctest::Approx(whole0).epsilon(1e-6));
  dp.optimizer_stepped(1);  // no redraw
  dp.optimizer_stepped(2);  // redraw: the model's features change, and the replicas copy them
  const auto [sharded2, whole2] = losses();
  CHECK(whole2 != whole0);  // the redraw moved the loss, so the check below can fail
  CHECK(sharded2 == doctest::Approx(whole2).epsilon(1e-6));
}

// The order itself, on values where association decides the result.
TEST_CASE("shard_tree: a fixed binary tree, absent leaves left out, rank blocks of 2^j shards are subtrees") {
  CHECK(shard_tree::split(2) == 1);
  CHECK(shard_tree::split(3) == 2);
  CHECK(shard_tree::split(4) == 2);
  CHECK(shard_tree::split(5) == 4);
  CHECK(shard_tree::split(8) == 4);
  // 1e8 + 1 rounds to 1e8 in float; the groupings below differ in their result.
  std::vector<float> g = {1e8f, 1.0f, -1e8f, 1.0f, 3.0f};
  const auto leaf_of = [&](const std::vector<bool>& present) {
    return [&g, present](int64_t k) -> const float* { return present[static_cast<size_t>(k)] ? &g[static_cast<size_t>(k)] : nullptr; };
  };
  std::vector<float> scratch(static_cast<size_t>(shard_tree::scratch_floats(5, 1)) + 1);
  const auto tree = [&](int64_t K, const std::vector<bool>& present, float start = 0.0f) {
    float out = start;
    const bool any = shard_tree::sum(0, K, leaf_of(present), &out, 1, scratch.data());
    return std::make_pair(any, out);
  };
  volatile float a = g[0], b = g[1], c = g[2], d = g[3], e = g[4];
  const float four = (a + b) + (c + d), three = (a + b) + c, five = ((a + b) + (c + d)) + e;
  const float sequential = ((a + b) + c) + d;
  REQUIRE(four != sequential);  // the test can tell the orders apart
  CHECK(tree(4, {true, true, true, true}).second == four);
  CHECK(tree(3, {true, true, true}).second == three);
  CHECK(tree(5, {true, true, true, true, true}).second == five);
  // Absent leaves are skipped, not added as zeros; none at all leaves out untouched.
  CHECK(tree(4, {false, true, true, true}).second == b + (c + d));
  CHECK(tree(4, {true, true, false, false}).second == a + b);
  const auto none = tree(4, {false, false, false, false}, 7.0f);
  CHECK_FALSE(none.first);
  CHECK(none.second == 7.0f);
  // Two ranks of two shards: each rank's partial, then the partials, give the four-shard tree.
  float r0 = 0, r1 = 0;
  shard_tree::sum(0, 2, leaf_of({true, true, true, true}), &r0, 1, scratch.data());
  shard_tree::sum(2, 4, leaf_of({true, true, true, true}), &r1, 1, scratch.data());
  std::vector<float> partials = {r0, r1};
  float top = 0;
  shard_tree::sum(0, 2, [&](int64_t k) -> const float* { return &partials[static_cast<size_t>(k)]; }, &top, 1,
                  scratch.data());
  CHECK(top == four);
  // Leaf 0 may be `out` itself (shard 0's gradient, summed in place), over
  // many values as well as one.
  float own = g[0];
  shard_tree::sum(0, 2, [&](int64_t k) -> const float* { return k == 0 ? &own : &g[1]; }, &own, 1, scratch.data());
  CHECK(own == a + b);
  std::vector<float> x(37), y(37), sum(37);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1e8f * static_cast<float>(i % 3), y[i] = 1.0f + static_cast<float>(i);
  std::vector<float> wide(static_cast<size_t>(shard_tree::scratch_floats(2, 37)));
  shard_tree::sum(0, 2, [&](int64_t k) { return k == 0 ? x.data() : y.data(); }, sum.data(), 37, wide.data());
  for (size_t i = 0; i < x.size(); ++i) CHECK(sum[i] == x[i] + y[i]);
}
