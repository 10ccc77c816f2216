// Early exit with CALM's state copying (layers/models/early_exit.h): a
// threshold that never passes is the TransformerLM bit for bit (forward and
// generation); the training loss is the weighted sum of the layers' losses,
// and its gradient checks; exits follow a reference written with plain ops,
// piece-by-piece reading equals the whole-sequence forward, and the states
// later layers read for a position that left are its exit layer's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "kind_tests.h"
#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/precision.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/layers/models/early_exit.h"

using namespace tapeformer;
using namespace kind_tests;
using kernels::Precision;
using kernels::ProductPrecision;

namespace {

ModelConfig exit_config(const std::string& heads = "shared") {
  ModelConfig c;
  c.vocab_size = 13;
  c.block_size = 16;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 8;
  c.arch = "early_exit";
  c.options["exit_heads"] = heads;
  return c;
}

std::unique_ptr<EarlyExitLM> make_exit_model(const ModelConfig& cfg, uint64_t seed = 5) {
  Rng rng(seed);
  std::unique_ptr<LanguageModel> m = make_model(cfg, rng);
  auto* e = dynamic_cast<EarlyExitLM*>(m.get());
  REQUIRE(e != nullptr);
  m.release();
  return std::unique_ptr<EarlyExitLM>(e);
}

IndexTensor some_ids(int64_t B, int64_t T, int64_t V, int64_t salt = 0) {
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7 + 3 + salt * 5 + i * i % 5) % V);
  return IndexTensor({B, T}, ids);
}

// Weights large enough that the layers' heads disagree and confidences spread.
void spread(EarlyExitLM& m) {
  for (const Var& p : m.parameters()) {
    Tensor v = p.value();
    for (int64_t i = 0; i < v.numel(); ++i) v.data()[i] *= 8;
  }
}

}  // namespace

TEST_CASE("early_exit: a threshold that never passes is the TransformerLM bit for bit, forward and generation") {
  const ModelConfig cfg = exit_config();
  std::unique_ptr<EarlyExitLM> model = make_exit_model(cfg);
  ModelConfig plain_cfg = cfg;
  plain_cfg.arch = "transformer";
  plain_cfg.options.clear();
  Rng rng(1);
  TransformerLM plain(plain_cfg, rng);
  NamedTensors weights;
  for (const auto& [name, t] : model->state())
    if (name.rfind("exit_", 0) != 0) weights.emplace_back(name, t);
  plain.load_state(weights);
  model->eval();
  plain.eval();
  NoGradGuard no_grad;
  const IndexTensor ids = some_ids(2, 11, 13);
  Rng unused(0);
  CHECK(max_abs_diff(model->forward(ids, unused).value(), plain.forward(ids, unused).value()) == 0.0);
  auto a = model->make_state(2), b = plain.make_state(2);
  for (int64_t t = 0; t < 11; ++t) {
    std::vector<int32_t> one = {ids.data[static_cast<size_t>(t)], ids.data[static_cast<size_t>(11 + t)]};
    const IndexTensor next({2, 1}, one);
    CHECK(max_abs_diff(model->forward(next, *a).value(), plain.forward(next, *b).value()) == 0.0);
  }
  CHECK(model->exit_counts() == std::vector<int64_t>{0, 0, 0});  // nothing counted without exits
  CHECK(model->layer_metrics().empty());
}

TEST_CASE("early_exit: the training loss is sum_n w_n CE(head_n(h^n)); gradcheck through the per-layer heads") {
  for (const std::string weights : {"linear", "uniform"}) {
    CAPTURE(weights);
    ModelConfig cfg = exit_config("per_layer");
    cfg.options["exit_weights"] = weights;
    std::unique_ptr<EarlyExitLM> model = make_exit_model(cfg);
    const IndexTensor ids = some_ids(2, 9, 13), targets = some_ids(2, 9, 13, 1);
    const std::vector<double> w = model->loss_weights();
    CHECK(w[0] == doctest::Approx(weights == "linear" ? 1.0 / 6 : 1.0 / 3));
    CHECK(w[2] == doctest::Approx(weights == "linear" ? 3.0 / 6 : 1.0 / 3));
    TapeScope tape;
    ModelContext ctx;
    Rng rng(2);
    ctx.rng = &rng;
    ctx.targets = &targets;
    const Var logits = model->forward(ids, ctx);
    const Var total = add(cross_entropy(logits, targets), model->auxiliary_loss(/*of_batch=*/true));
    // The reference from the parts: each layer's state through its own head.
    Var h = model->pos_emb->embed(model->tok_emb->forward(ids), 0);
    double expected = 0;
    for (int64_t n = 1; n <= 3; ++n) {
      h = model->blocks->blocks[static_cast<size_t>(n - 1)]->forward(h, rng);
      expected += w[static_cast<size_t>(n - 1)] * cross_entropy(model->exit_logits(h, n), targets).item();
    }
    CHECK(total.item() == doctest::Approx(expected).epsilon(1e-6));
    CHECK(max_abs_diff(logits.value(), model->exit_logits(h, 3).value()) == 0.0);
  }
  // The gradient of the whole loss in the per-layer heads and a block's weights.
  ModelConfig cfg = exit_config("per_layer");
  std::unique_ptr<EarlyExitLM> model = make_exit_model(cfg);
  const IndexTensor ids = some_ids(1, 6, 13), targets = some_ids(1, 6, 13, 2);
  const auto loss = [&] {
    ModelContext ctx;
    ctx.targets = &targets;
    const Var logits = model->forward(ids, ctx);  // first: it sets the auxiliary loss
    return add(cross_entropy(logits, targets), model->auxiliary_loss(true));
  };
  GradcheckOptions opt;
  opt.extrapolate = true;
  opt.step_floor = 0.02;
  opt.label = "early-exit loss";
  const GradcheckResult r = gradcheck_vars(loss, {model->exit_heads[0]->weight, model->exit_norms[1]->weight,
                                                   model->blocks->blocks[0]->mlp->parameters()[0]},
                                           opt);
  CHECK_MESSAGE(r.ok, r.message);
  // Without targets (evaluation) there is no auxiliary loss.
  model->forward(ids, ModelContext{});
  CHECK_FALSE(model->auxiliary_loss(true).defined());
}

TEST_CASE("early_exit: confidence measures on hand values") {
  std::unique_ptr<EarlyExitLM> model = make_exit_model(exit_config());
  // Logits log(0.5), log(0.3), log(0.2): max 0.5, margin 0.2.
  const Tensor z = Tensor::from({1, 1, 3}, {std::log(0.5f), std::log(0.3f), std::log(0.2f)});
  const Tensor h = Tensor::from({1, 1, 2}, {1, 0}), g = Tensor::from({1, 1, 2}, {1, 1});
  model->set_measure(EarlyExitLM::Confidence::max);
  CHECK(model->confidence(z, h, g).data()[0] == doctest::Approx(0.5).epsilon(1e-6));
  model->set_measure(EarlyExitLM::Confidence::margin);
  CHECK(model->confidence(z, h, g).data()[0] == doctest::Approx(0.2).epsilon(1e-6));
  model->set_measure(EarlyExitLM::Confidence::cosine);
  CHECK(model->confidence(z, h, g).data()[0] == doctest::Approx(std::sqrt(0.5)).epsilon(1e-6));
  CHECK_THROWS_WITH_AS(EarlyExitLM::parse_confidence("entropy"), doctest::Contains("model.exit_confidence"), Error);
}

TEST_CASE("early_exit: exits follow a reference from plain ops; reading piece by piece equals the whole sequence") {
  for (const std::string heads : {"shared", "per_layer"}) {
    CAPTURE(heads);
    std::unique_ptr<EarlyExitLM> model = make_exit_model(exit_config(heads));
    spread(*model);
    model->eval();
    NoGradGuard no_grad;
    const IndexTensor ids = some_ids(2, 12, 13);
    Rng unused(0);
    // lambda: the median of layer 1's max probabilities, so that some positions leave there.
    Var h0 = model->pos_emb->embed(model->tok_emb->forward(ids), 0);
    const Tensor p1 = max(softmax(model->exit_logits(model->blocks->blocks[0]->forward(h0, unused), 1)), 2).value();
    std::vector<Scalar> sorted = p1.contiguous().to_vector();
    std::sort(sorted.begin(), sorted.end());
    const double lambda = (sorted[11] + sorted[12]) / 2;
    model->set_threshold(lambda);
    const Tensor out = model->forward(ids, unused).value();
    const IndexTensor exits = model->last_exit_layers();
    // The reference: layer by layer, positions leaving where max softmax >= lambda, their state kept.
    Tensor running = Tensor::ones({2, 12, 1});
    Var h = h0, expected;
    std::vector<int32_t> want(24, 3);
    for (int64_t n = 1; n <= 3; ++n) {
      h = where(running, model->blocks->blocks[static_cast<size_t>(n - 1)]->forward(h, unused), h);
      const Var logits = model->exit_logits(h, n);
      if (n == 3) {
        expected = expected.defined() ? where(running, logits, expected) : logits;
        break;
      }
      const Tensor p = max(softmax(logits), 2).value();
      Tensor leave = Tensor::zeros({2, 12, 1});
      for (int64_t i = 0; i < 24; ++i)
        if (running.data()[i] != 0 && p.data()[i] >= lambda) leave.data()[i] = 1, running.data()[i] = 0, want[i] = int32_t(n);
      expected = expected.defined() ? where(leave, logits, expected) : where(leave, logits, Var(Tensor::zeros({2, 12, 13})));
    }
    CHECK(exits.data == want);
    int64_t at_1 = 0, at_3 = 0;
    for (int32_t e : want) at_1 += e == 1, at_3 += e == 3;
    CHECK(at_1 >= 10);  // the median: about half leave after layer 1
    CHECK(at_3 >= 1);
    CHECK(max_abs_diff(out, expected.value()) < 1e-5);
    // Piece by piece: the prompt of 5, then one position at a time.
    auto state = model->make_state(2);
    std::vector<Tensor> rows;
    std::vector<int32_t> prompt;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < 5; ++t) prompt.push_back(ids.data[static_cast<size_t>(b * 12 + t)]);
    rows.push_back(model->forward(IndexTensor({2, 5}, prompt), *state).value());
    for (int64_t t = 5; t < 12; ++t) {
      std::vector<int32_t> one = {ids.data[static_cast<size_t>(t)], ids.data[static_cast<size_t>(12 + t)]};
      rows.push_back(model->forward(IndexTensor({2, 1}, one), *state).value());
    }
    std::vector<Var> parts;
    for (const Tensor& r : rows) parts.emplace_back(r);
    CHECK(max_abs_diff(concat(parts, 1).value(), out) < 1e-5);
  }
}

TEST_CASE("early_exit: every position leaving at layer 1 leaves its layer-1 state in the later layers' caches") {
  std::unique_ptr<EarlyExitLM> model = make_exit_model(exit_config("per_layer"));
  spread(*model);
  model->eval();
  NoGradGuard no_grad;
  const IndexTensor ids = some_ids(1, 8, 13);
  std::vector<int32_t> prompt(ids.data.begin(), ids.data.begin() + 7);
  auto state = model->make_state(1);
  model->set_threshold(-1);  // every confidence passes: all leave after layer 1
  const Tensor first = model->forward(IndexTensor({1, 7}, prompt), *state).value();
  for (int32_t e : model->last_exit_layers().data) CHECK(e == 1);
  Rng unused(0);
  const Var h0 = model->pos_emb->embed(model->tok_emb->forward(ids), 0);  // (1, 8, C)
  const Var h1 = model->blocks->blocks[0]->forward(h0, unused);
  CHECK(max_abs_diff(first, slice(model->exit_logits(h1, 1), 1, 0, 7).value()) < 1e-5);
  // The last position runs every layer (no exits), reading the prompt's copied states h^1.
  model->set_threshold(2);
  const Tensor last = model->forward(IndexTensor({1, 1}, {ids.data[7]}), *state).value();
  Tensor prompt_rows = Tensor::zeros({1, 8, 1});
  for (int64_t t = 0; t < 7; ++t) prompt_rows.data()[t] = 1;
  Var h = h1;
  for (size_t i = 1; i < 3; ++i) h = where(prompt_rows, h1, model->blocks->blocks[i]->forward(h, unused));
  const Tensor calm = slice(model->exit_logits(h, 3), 1, 7, 8).value();
  CHECK(max_abs_diff(last, calm) < 1e-5);
  // Not what it would read had the prompt run every layer.
  const Tensor full = slice(model->exit_logits(model->blocks->forward(h0, unused), 3), 1, 7, 8).value();
  CHECK(max_abs_diff(last, full) > 1e-3);
}

TEST_CASE("early_exit: exits are counted by layer; the threshold and measure are in the checkpoint") {
  std::unique_ptr<EarlyExitLM> model = make_exit_model(exit_config());
  spread(*model);
  model->eval();
  model->set_threshold(-1);
  model->set_measure(EarlyExitLM::Confidence::margin);
  {
    NoGradGuard no_grad;
    Rng unused(0);
    model->forward(some_ids(2, 5, 13), unused);
  }
  CHECK(model->exit_counts() == std::vector<int64_t>{10, 0, 0});
  const auto metrics = model->layer_metrics();
  REQUIRE(metrics.size() == 2);
  CHECK(metrics[0].first == "exit_layers_mean");
  CHECK(metrics[0].second[0] == 1.0);
  model->reset_exit_counts();
  CHECK(model->layer_metrics().empty());
  std::unique_ptr<EarlyExitLM> other = make_exit_model(exit_config(), 9);
  other->load_state(model->state());
  CHECK(other->threshold() == -1.0);
  CHECK(other->measure() == EarlyExitLM::Confidence::margin);
}

TEST_CASE("early_exit: parameters of the kind; other blocks, memories and bad options are refused by name") {
  for (const std::string heads : {"shared", "per_layer"}) {
    std::unique_ptr<EarlyExitLM> model = make_exit_model(exit_config(heads));  // make_model checks the count
    ModelConfig plain = exit_config();
    plain.arch = "transformer";
    plain.options.clear();
    CHECK(model->num_parameters() == model_footprint(plain).parameters + (heads == "per_layer" ? 2 * (16 + 8 * 13) : 0));
  }
  ModelConfig bad = exit_config();
  bad.block = "reversible";
  CHECK_THROWS_WITH_AS(model_footprint(bad), doctest::Contains("model.block \"standard\""), Error);
  bad = exit_config();
  bad.options["mem_len"] = int64_t{8};
  CHECK_THROWS_WITH_AS(model_footprint(bad), doctest::Contains("segment memory"), Error);
  bad = exit_config();
  bad.options["exit_heads"] = std::string("every");
  CHECK_THROWS_WITH_AS(model_footprint(bad), doctest::Contains("model.exit_heads"), Error);
}

TEST_CASE("early_exit: reading piece by piece, skipping the layers after an exit gives the full-depth numbers bit for bit") {
  // Full depth runs every layer for every position (the where() of the whole
  // forward); skipping computes only the keys and values of a position that
  // left. Same logits and exits at every threshold, from an empty cache (the
  // fused kernel's rows) and after it, with RoPE (the offset kernel) too;
  // widths 8 and 32 (rows of 32 bytes, normalised in place; of 128 bytes,
  // gathered first); all positions kept, or a window of 8 that drops old
  // ones; fp32 products, and bf16 ones (the portable kernel's bits).
  int64_t mixed = 0;  // calls where some positions of a piece left and others ran on
  struct Case {
    std::string heads, positional, measure;
    int64_t width, window;
    Precision precision;
  };
  std::vector<Case> cases;
  for (const std::string heads : {"shared", "per_layer"})
    for (const std::string positional : {"learned", "rope"})
      for (const std::string measure : {"max", "cosine"})
        cases.push_back({heads, positional, measure, 8, -1, Precision::fp32});
  cases.push_back({"shared", "learned", "max", 32, -1, Precision::fp32});
  cases.push_back({"per_layer", "learned", "cosine", 32, -1, Precision::fp32});
  cases.push_back({"shared", "learned", "max", 32, 8, Precision::fp32});
  cases.push_back({"shared", "rope", "cosine", 8, 8, Precision::fp32});
  cases.push_back({"shared", "learned", "max", 32, -1, Precision::bf16_portable});
  for (const Case& k : cases) {
    CAPTURE(k.heads);
    CAPTURE(k.positional);
    CAPTURE(k.measure);
    CAPTURE(k.width);
    CAPTURE(k.window);
    CAPTURE(static_cast<int>(k.precision));
    const ProductPrecision precision(k.precision);
    ModelConfig cfg = exit_config(k.heads);
    cfg.positional = k.positional;
    cfg.n_embd = k.width;
    cfg.options["exit_confidence"] = k.measure;
    std::unique_ptr<EarlyExitLM> model = make_exit_model(cfg);
    spread(*model);
    model->eval();
    NoGradGuard no_grad;
    const IndexTensor ids = some_ids(2, 16, 13, 1);
    const auto piece = [&](int64_t t0, int64_t t1) {
      std::vector<int32_t> v;
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t t = t0; t < t1; ++t) v.push_back(ids.data[static_cast<size_t>(b * 16 + t)]);
      return IndexTensor({2, t1 - t0}, v);
    };
    const std::vector<std::pair<int64_t, int64_t>> pieces = {{0, 7}, {7, 8}, {8, 9}, {9, 12}, {12, 13}};
    for (const double lambda : {-1.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 2.0}) {
      CAPTURE(lambda);
      model->set_threshold(lambda);
      const auto skipping = model->make_state(2, k.window), full = model->make_state(2, k.window);
      for (const auto& [t0, t1] : pieces) {
        CHECK(model->set_full_depth(true));
        CHECK(model->full_depth());
        const Tensor want = model->forward(piece(t0, t1), *full).value();
        const IndexTensor want_exits = model->last_exit_layers();
        model->set_full_depth(false);
        CHECK(!model->full_depth());
        const Tensor got = model->forward(piece(t0, t1), *skipping).value();
        CHECK(model->last_exit_layers().data == want_exits.data);
        CHECK(max_abs_diff(got, want) == 0.0);
        const auto& e = want_exits.data;
        mixed += std::count(e.begin(), e.end(), 3) > 0 && std::count(e.begin(), e.end(), 3) < int64_t(e.size());
      }
    }
  }
  CHECK(mixed >= 25);
}

TEST_CASE("early_exit: evaluation forwards on several threads count every position and drop the training loss") {
  // DataParallel::losses runs eval forwards of one model on every thread:
  // what a forward leaves (the exits counted, the last training forward's
  // auxiliary loss let go, once) is kept under a lock.
  std::unique_ptr<EarlyExitLM> model = make_exit_model(exit_config());
  const IndexTensor ids = some_ids(2, 12, 13), targets = some_ids(2, 12, 13, 3);
  model->train();
  ModelContext ctx;
  ctx.targets = &targets;
  Rng rng(1);
  ctx.rng = &rng;
  model->forward(ids, ctx);
  REQUIRE(model->auxiliary_loss(true).defined());
  model->eval();
  model->set_threshold(0.0);  // every position leaves after layer 1
  parallel::set_num_threads(2);
  parallel::parallel_for(16, 1, [&](int64_t b0, int64_t b1) {
    NoGradGuard no_grad;
    Rng unused(0);
    for (int64_t b = b0; b < b1; ++b) model->forward(ids, unused);
  });
  parallel::set_num_threads(0);
  const std::vector<int64_t> counts = model->exit_counts();
  CHECK(counts[0] == 16 * 24);
  CHECK_FALSE(model->auxiliary_loss(true).defined());
}
