// The Decision Transformer model kind (layers/models/decision_transformer.h):
// an action prediction reads the steps before it and its own return and
// state, never a later step nor its own action; on one-step episodes it is a
// classifier of the action given the state; a constant return to go, or the
// return embedding at zero, makes it behaviour cloning; reading step by step
// equals the whole window, and with a segment memory a window twice as
// long; bad inputs are refused by name.
#include <doctest/doctest.h>

#include "kind_tests.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/data/rl/episode_windows.h"
#include "tapeformer/layers/models/decision_transformer.h"

using namespace tapeformer;
using namespace kind_tests;

namespace {

ModelConfig dt_config(bool returns = true) {
  ModelConfig c;
  c.vocab_size = 4;  // actions
  c.block_size = 8;  // steps
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.arch = "decision_transformer";
  c.options["dt_state_sizes"] = std::string("6,3");
  c.options["dt_max_timestep"] = int64_t{30};
  c.options["dt_return_scale"] = 10.0;
  c.options["dt_returns"] = returns;
  return c;
}

struct Steps {
  IndexTensor ids;  // previous actions (B, K)
  ModelInputs inputs;
};

Steps some_steps(int64_t B, int64_t K, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids, states, returns, time;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < K; ++t) {
      ids.push_back(t == 0 ? 4 : static_cast<int32_t>(rng.below(4)));
      states.push_back(static_cast<int32_t>(rng.below(6)));
      states.push_back(static_cast<int32_t>(rng.below(3)));
      returns.push_back(static_cast<int32_t>(rng.below(21)) - 10);
      time.push_back(static_cast<int32_t>(t + 3));
    }
  return {IndexTensor({B, K}, ids),
          {{"states", IndexTensor({B, K, 2}, states)}, {"returns", IndexTensor({B, K}, returns)},
           {"timesteps", IndexTensor({B, K}, time)}}};
}

std::unique_ptr<LanguageModel> built(const ModelConfig& cfg) {
  Rng rng(5);
  std::unique_ptr<LanguageModel> m = make_model(cfg, rng);  // checks the kind's parameter count
  for (const Var& p : m->parameters()) {  // weights large enough that every token matters
    Tensor v = p.value();
    rng.fill_normal(v, 0.0f, 0.3f);
  }
  m->eval();
  return m;
}

Tensor run(const LanguageModel& m, const Steps& s) {
  NoGradGuard no_grad;
  ModelContext ctx;
  ctx.inputs = &s.inputs;
  return m.forward(s.ids, ctx).value();  // (B, K, A)
}

}  // namespace

TEST_CASE("decision_transformer: a prediction reads earlier steps and its own return and state, nothing later") {
  const auto model = built(dt_config());
  const Steps base = some_steps(2, 8, 1);
  const Tensor before = run(*model, base);
  REQUIRE(before.shape() == Shape({2, 8, 4}));
  const int64_t t = 4;
  // Changing step t's own action (ids[t + 1]) and everything of later steps changes nothing up to t.
  for (const std::string what : {"action", "states", "returns", "timesteps"}) {
    CAPTURE(what);
    Steps s = base;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t u = t + 1; u < 8; ++u) {
        if (what == "action") s.ids.data[static_cast<size_t>(b * 8 + u)] = (s.ids.data[static_cast<size_t>(b * 8 + u)] + 1) % 4;
        if (what == "states") s.inputs["states"].data[static_cast<size_t>((b * 8 + u) * 2)] ^= 1;
        if (what == "returns") s.inputs["returns"].data[static_cast<size_t>(b * 8 + u)] += 7;
        if (what == "timesteps") s.inputs["timesteps"].data[static_cast<size_t>(b * 8 + u)] += 5;
      }
    const Tensor after = run(*model, s);
    CHECK(max_abs_diff(after.slice(1, 0, t + 1), before.slice(1, 0, t + 1)) == 0.0);
    CHECK(max_abs_diff(after.slice(1, t + 1, 8), before.slice(1, t + 1, 8)) > 1e-4);
  }
  // Its own return, its own state and the previous action do reach it.
  for (const std::string what : {"previous action", "state", "return"}) {
    CAPTURE(what);
    Steps s = base;
    if (what == "previous action") s.ids.data[t] = (s.ids.data[t] + 1) % 4;
    if (what == "state") s.inputs["states"].data[static_cast<size_t>(t * 2 + 1)] = (s.inputs["states"].data[static_cast<size_t>(t * 2 + 1)] + 1) % 3;
    if (what == "return") s.inputs["returns"].data[t] += 9;
    const Tensor after = run(*model, s);
    CHECK(max_abs_diff(after.slice(1, 0, t), before.slice(1, 0, t)) == 0.0);
    CHECK(max_abs_diff(after.slice(1, t, t + 1), before.slice(1, t, t + 1)) > 1e-4);
  }
}

TEST_CASE("decision_transformer: on episodes of one step it is a classifier of the action given the state") {
  // Twelve one-step episodes in windows of K = 8 steps (seven of padding):
  // the training loss, and its gradient, equal the cross-entropy of a
  // classifier written here from the model's parts, which reads the start
  // token, (the return,) and the state at timestep 0 and nothing else.
  Trajectories data;
  data.env = "test";
  data.feature_sizes = {6, 3};
  data.actions = 4;
  data.max_steps = 1;
  Rng draw(11);
  const int64_t N = 12;
  std::vector<int32_t> s0, s1, acts, rewards;
  for (int64_t i = 0; i < N; ++i) {
    Episode e;
    e.observations = {{static_cast<int32_t>(draw.below(6)), static_cast<int32_t>(draw.below(3))}};
    e.actions = {static_cast<int32_t>(draw.below(4))};
    e.rewards = {static_cast<int32_t>(draw.below(9)) - 4};
    s0.push_back(e.observations[0][0]), s1.push_back(e.observations[0][1]);
    acts.push_back(e.actions[0]), rewards.push_back(e.rewards[0]);
    data.episodes.push_back(e);
  }
  std::vector<int64_t> all(N);
  std::vector<std::pair<int64_t, int64_t>> at;
  for (int64_t i = 0; i < N; ++i) all[static_cast<size_t>(i)] = i, at.emplace_back(i, 0);
  for (const bool returns : {false, true}) {
    CAPTURE(returns);
    const auto model = built(dt_config(returns));
    const auto* dt = dynamic_cast<const DecisionTransformer*>(model.get());
    REQUIRE(dt != nullptr);
    const Batch b = EpisodeWindows(data, all, 8, N, 1).windows(at);
    const Var loss = cross_entropy(model->forward(b.inputs, ModelContext{nullptr, nullptr, nullptr, &b.extra}), b.targets);
    backward(loss);
    std::vector<Tensor> grads;
    for (const Var& p : model->parameters()) grads.push_back(p.has_grad() ? p.grad().contiguous() : Tensor());
    for (const Var& p : model->parameters()) p.zero_grad();

    // The classifier: per episode the tokens [start, (return,) state], each
    // with timestep 0's embedding, through the model's layers; read at the state.
    const IndexTensor zero({N, 1}, std::vector<int32_t>(N, 0));
    const Var t0 = dt->time_emb->forward(zero);  // (N, 1, C)
    std::vector<Var> tokens = {add(dt->action_emb->forward(IndexTensor({N, 1}, std::vector<int32_t>(N, 4))), t0)};
    if (returns) {
      Tensor r = Tensor::empty({N, 1, 1});
      for (int64_t i = 0; i < N; ++i) r.data()[i] = static_cast<Scalar>(rewards[static_cast<size_t>(i)] / 10.0);
      tokens.push_back(add(dt->return_emb->forward(Var(r)), t0));
    }
    tokens.push_back(add(add(dt->state_emb[0]->forward(IndexTensor({N, 1}, s0)),
                             dt->state_emb[1]->forward(IndexTensor({N, 1}, s1))), t0));
    const int64_t P = static_cast<int64_t>(tokens.size());
    Rng none(0);
    const Var h = dt->stack->forward(dt->pos_emb->embed(dt->embed_ln->forward(concat(tokens, 1)), 0), none);
    const Var logits = dt->head->forward(dt->ln_f->forward(slice(h, 1, P - 1, P)));  // (N, 1, A)
    const Var classifier = cross_entropy(logits, IndexTensor({N, 1}, acts));
    backward(classifier);
    CHECK(std::abs(loss.item() - classifier.item()) < 1e-6);
    const std::vector<Var> params = model->parameters();
    double worst = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) {
        CHECK_FALSE(params[i].has_grad());
        continue;
      }
      REQUIRE(params[i].has_grad());
      worst = std::max(worst, max_abs_diff(grads[i], params[i].grad()));
    }
    CHECK(worst < 1e-6);
    CHECK(std::abs(classifier.item()) > 0.1);
  }
}

TEST_CASE("decision_transformer: a constant return to go conditions on nothing: behaviour cloning") {
  // With R_t = c at every step, the return token's input c / scale is a
  // constant, so the return embedding's weight w only adds w c / scale to
  // its bias: the model equals the same model at R_t = 0 with that bias, for
  // every c. What it can learn from such data is a policy of states and
  // previous actions: behaviour cloning.
  const auto model = built(dt_config());
  auto* dt = dynamic_cast<DecisionTransformer*>(model.get());
  REQUIRE(dt != nullptr);
  Steps at_c = some_steps(2, 8, 9);
  for (int32_t& r : at_c.inputs["returns"].data) r = 7;
  Steps at_zero = at_c;
  for (int32_t& r : at_zero.inputs["returns"].data) r = 0;
  const Tensor with_c = run(*model, at_c);
  CHECK(max_abs_diff(with_c, run(*model, at_zero)) > 1e-3);  // the constant itself is read
  Tensor& bias = dt->return_emb->bias.value();
  const Tensor& w = dt->return_emb->weight.value();
  for (int64_t j = 0; j < bias.numel(); ++j) bias.data()[j] += w.data()[j] * 0.7f;  // w (C, 1): w c / scale
  CHECK(max_abs_diff(with_c, run(*model, at_zero)) < 1e-5);
}

TEST_CASE("decision_transformer: with the return embedding at zero the returns change nothing (behaviour cloning)") {
  const auto model = built(dt_config());
  auto* dt = dynamic_cast<DecisionTransformer*>(model.get());
  REQUIRE(dt != nullptr);
  dt->return_emb->weight.value().fill(0);
  dt->return_emb->bias.value().fill(0);
  const Steps base = some_steps(2, 8, 2);
  Steps other = base;
  for (int32_t& r : other.inputs["returns"].data) r = 3;  // a constant return to go
  CHECK(max_abs_diff(run(*model, base), run(*model, other)) == 0.0);
  // Without return tokens the model reads no returns at all.
  const auto bc = built(dt_config(false));
  Steps no_returns = base;
  no_returns.inputs.erase("returns");
  CHECK(run(*bc, no_returns).shape() == Shape({2, 8, 4}));
}

TEST_CASE("decision_transformer: step by step equals the whole window; a longer episode slides the window") {
  const auto model = built(dt_config());
  const Steps all = some_steps(2, 8, 3);
  const Tensor whole = run(*model, all);
  NoGradGuard no_grad;
  auto state = model->make_state(2);
  for (int64_t t = 0; t < 8; ++t) {
    Steps one;
    one.ids = IndexTensor({2, 1}, {all.ids.data[static_cast<size_t>(t)], all.ids.data[static_cast<size_t>(8 + t)]});
    const auto col = [&](const char* name, int64_t w) {
      const IndexTensor& x = all.inputs.at(name);
      std::vector<int32_t> v;
      for (int64_t b = 0; b < 2; ++b)
        v.insert(v.end(), x.data.begin() + (b * 8 + t) * w, x.data.begin() + (b * 8 + t + 1) * w);
      return w == 1 ? IndexTensor({2, 1}, v) : IndexTensor({2, 1, w}, v);
    };
    one.inputs = {{"states", col("states", 2)}, {"returns", col("returns", 1)}, {"timesteps", col("timesteps", 1)}};
    ModelContext ctx;
    ctx.state = state.get();
    ctx.inputs = &one.inputs;
    const Tensor got = model->forward(one.ids, ctx).value();
    CHECK(max_abs_diff(got, whole.slice(1, t, t + 1)) < 1e-5);
  }
  CHECK(state->length() == 8);
}

TEST_CASE("decision_transformer: missing or malformed inputs, actions and states out of range are refused by name") {
  const auto model = built(dt_config());
  Steps s = some_steps(1, 4, 4);
  s.inputs.erase("timesteps");
  CHECK_THROWS_WITH_AS(run(*model, s), doctest::Contains("\"timesteps\""), Error);
  s = some_steps(1, 4, 4);
  s.inputs["states"] = IndexTensor({1, 4, 3}, std::vector<int32_t>(12, 0));
  CHECK_THROWS_WITH_AS(run(*model, s), doctest::Contains("\"states\" is [1, 4, 3], expected [1, 4, 2]"), Error);
  s = some_steps(1, 4, 4);
  s.inputs["states"].data[1] = 3;  // feature 1 takes 0..2
  CHECK_THROWS_WITH_AS(run(*model, s), doctest::Contains("state feature 1 = 3 is outside 0..2"), Error);
  s = some_steps(1, 4, 4);
  s.ids.data[2] = 5;
  CHECK_THROWS_WITH_AS(run(*model, s), doctest::Contains("action id 5 is outside 0..4"), Error);
  s = some_steps(1, 9, 4);
  CHECK_THROWS_WITH_AS(run(*model, s), doctest::Contains("exceeds model.block_size"), Error);
  ModelConfig bad = dt_config();
  bad.options["dt_state_sizes"] = std::string("6,x");
  CHECK_THROWS_WITH_AS(model_footprint(bad), doctest::Contains("model.dt_state_sizes"), Error);
  bad = dt_config();
  bad.block = "gtrxl";
  bad.positional = "txl";
  bad.options["mem_len"] = int64_t{8};
  bad.options["ext_len"] = int64_t{2};
  CHECK_THROWS_WITH_AS(model_footprint(bad), doctest::Contains("model.ext_len must be 0"), Error);
}

namespace {

// A GTrXL backbone with Transformer-XL's relative positions (no table, so
// the same weights serve any window) and `mem_len` steps of segment memory.
ModelConfig xl_config(int64_t K, int64_t mem_len) {
  ModelConfig c = dt_config();
  c.block = "gtrxl";
  c.positional = "txl";
  c.block_size = K;
  c.options["mem_len"] = mem_len;
  return c;
}

// Steps [from, to) of every row of s.
Steps cut(const Steps& s, int64_t from, int64_t to) {
  const int64_t B = s.ids.shape[0], K = s.ids.shape[1];
  const auto part = [&](const IndexTensor& x, int64_t w) {
    std::vector<int32_t> v;
    for (int64_t b = 0; b < B; ++b) v.insert(v.end(), x.data.begin() + (b * K + from) * w, x.data.begin() + (b * K + to) * w);
    return w == 1 ? IndexTensor({B, to - from}, v) : IndexTensor({B, to - from, w}, v);
  };
  return {part(s.ids, 1),
          {{"states", part(s.inputs.at("states"), 2)}, {"returns", part(s.inputs.at("returns"), 1)},
           {"timesteps", part(s.inputs.at("timesteps"), 1)}}};
}

}  // namespace

TEST_CASE("decision_transformer: a segment memory of K steps reads the next segment as a window of 2K would") {
  // Two segments of K = 4 steps with 4 steps of memory: every layer of the
  // second attends to the first segment's layer inputs, which a causal window
  // of 8 steps computes alike, so the second segment's actions equal the
  // window's last 4.
  const auto xl = built(xl_config(4, 4));
  const auto wide = built(xl_config(8, 0));
  wide->load_state(xl->state());
  REQUIRE(xl->memory_use().carried());
  CHECK(xl->memory_use().mem_len == 12);  // 4 steps of 3 tokens
  CHECK_FALSE(wide->memory_use().carried());
  const Steps all = some_steps(2, 8, 6);
  const Tensor whole = run(*wide, all);
  NoGradGuard no_grad;
  SegmentMemory memory;
  const auto segment = [&](int64_t from) {
    const Steps s = cut(all, from, from + 4);
    ModelContext ctx;
    ctx.inputs = &s.inputs;
    ctx.memory = &memory;
    return xl->forward(s.ids, ctx).value();
  };
  const Tensor first = segment(0), second = segment(4);
  CHECK(max_abs_diff(first, whole.slice(1, 0, 4)) < 1e-5);
  CHECK(max_abs_diff(second, whole.slice(1, 4, 8)) < 1e-5);
  // Without the memory the second segment reads less, and differs.
  memory.reset();
  CHECK(max_abs_diff(segment(4), whole.slice(1, 4, 8)) > 1e-3);

  // Acting step by step reads the segments as training did: the same actions.
  auto state = xl->make_state(2);
  for (int64_t t = 0; t < 8; ++t) {
    const Steps one = cut(all, t, t + 1);
    ModelContext ctx;
    ctx.state = state.get();
    ctx.inputs = &one.inputs;
    const Tensor got = xl->forward(one.ids, ctx).value();
    CHECK(max_abs_diff(got, whole.slice(1, t, t + 1)) < 1e-5);
  }
  // Pieces of several steps, one crossing a segment's end (steps 2..4), read alike.
  state->reset();
  for (const auto& [from, to] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 5}, {5, 8}}) {
    const Steps piece = cut(all, from, to);
    ModelContext ctx;
    ctx.state = state.get();
    ctx.inputs = &piece.inputs;
    const Tensor got = xl->forward(piece.ids, ctx).value();
    CHECK(max_abs_diff(got, whole.slice(1, from, to)) < 1e-5);
  }
  // A block kind without memory, or a memory other than the segment memory, is refused by name.
  ModelConfig bad = xl_config(4, 4);
  bad.options["cmem_len"] = int64_t{4};
  bad.options["cmem_ratio"] = int64_t{2};
  CHECK_THROWS_WITH_AS(model_footprint(bad), doctest::Contains("carries Transformer-XL's segment memory"), Error);
}
