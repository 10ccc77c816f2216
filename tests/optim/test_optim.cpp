// optim/: SGD, Adam, AdamW, clip_grad_norm and the cosine schedule against
// PyTorch (tests/fixtures/optim_golden.txt, made by
// tests/fixtures/make_optim_golden.py), plus state round trips, validation
// errors, decay groups and the blocked/parallel update path.
//
// Tolerance: |a - b| <= 1e-6 * max(1, |b|) for parameters and gradients (the
// remaining differences are float rounding of hyperparameters: PyTorch holds
// betas as doubles, we as floats); schedule values relative 1e-6.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "golden.h"
#include "tapeformer/optim/clip.h"
#include "tapeformer/optim/optimizer.h"
#include "tapeformer/optim/schedule.h"

namespace {

constexpr double kTol = 1e-6;

const Golden& fixture() {
  static const Golden g = load_golden_file(std::string(TAPEFORMER_FIXTURE_DIR) + "/optim_golden.txt");
  return g;
}

void check_near(const Tensor& actual, const Tensor& expected, const std::string& what) {
  REQUIRE_MESSAGE(actual.shape() == expected.shape(), what);
  const auto a = actual.to_vector(), b = expected.to_vector();
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::abs(double(a[i]) - b[i]) / std::max(1.0, std::abs(double(b[i])));
    if (!(err <= worst)) worst = err, at = i;  // NaN becomes the worst
  }
  CHECK_MESSAGE(worst <= kTol, what, ": element ", at, " got ", a[at], ", expected ", b[at], " (rel err ", worst,
                ")");
}

// w [3, 4] and b [4] from the fixture, with the fixture's gradients for step i.
struct Params {
  Var w, b;
  Params() : w(fixture().tensor("w0").clone(), true, "w"), b(fixture().tensor("b0").clone(), true, "b") {}
  NamedVars named() const { return {{"w", w}, {"b", b}}; }
  std::vector<ParamGroup> group(float lr, float wd) const { return {{named(), lr, wd}}; }
  void set_grads(int i, bool bias = true) {
    w.zero_grad();
    b.zero_grad();
    accumulate_grad(w, fixture().tensor("gw" + std::to_string(i)).clone(), "test");
    if (bias) accumulate_grad(b, fixture().tensor("gb" + std::to_string(i)).clone(), "test");
  }
};

using Make = std::function<std::unique_ptr<Optimizer>(const Params&)>;

const std::vector<std::pair<std::string, Make>>& cases() {
  static const std::vector<std::pair<std::string, Make>> all = {
      {"sgd", [](const Params& p) { return std::make_unique<SGD>(p.group(0.1f, 0)); }},
      {"sgd_nesterov", [](const Params& p) { return std::make_unique<SGD>(p.group(0.1f, 0.01f), 0.9f, 0.0f, true); }},
      {"sgd_momentum", [](const Params& p) { return std::make_unique<SGD>(p.group(0.1f, 0.01f), 0.9f, 0.1f); }},
      {"adam", [](const Params& p) { return std::make_unique<Adam>(p.group(0.01f, 0.01f), 0.9f, 0.999f, 1e-8f); }},
      {"adam_skip", [](const Params& p) { return std::make_unique<Adam>(p.group(0.01f, 0), 0.9f, 0.999f, 1e-8f); }},
      // decay_groups: w (rank 2) decays, b (rank 1) does not: the fixture's two groups.
      {"adamw", [](const Params& p) { return std::make_unique<AdamW>(decay_groups(p.named(), 0.01f, 0.1f), 0.9f, 0.99f); }},
  };
  return all;
}

// The fixture's cases where b has no gradient at step 0.
bool skips_bias(const std::string& name, int step) {
  return step == 0 && (name == "sgd_momentum" || name == "adam_skip");
}

}  // namespace

TEST_CASE("SGD, Adam and AdamW match torch.optim for three steps") {
  for (const auto& [case_name, make] : cases()) {
    const std::string& name = case_name;  // CAPTURE's lambda cannot take a binding (C++17)
    CAPTURE(name);
    Params p;
    auto opt = make(p);
    for (int i = 0; i < 3; ++i) {
      p.set_grads(i, !skips_bias(name, i));
      opt->step();
      check_near(p.w.value(), fixture().tensor(name + "_w" + std::to_string(i)), name + " w step " + std::to_string(i));
      check_near(p.b.value(), fixture().tensor(name + "_b" + std::to_string(i)), name + " b step " + std::to_string(i));
    }
    CHECK(opt->step_count() == 3);
  }
}

TEST_CASE("clip_grad_norm matches torch.nn.utils.clip_grad_norm_") {
  Params p;
  p.w.zero_grad();
  p.b.zero_grad();
  Tensor gw = fixture().tensor("gw0").clone(), gb = fixture().tensor("gb0").clone();
  for (Tensor* t : {&gw, &gb})
    for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] *= 3;
  accumulate_grad(p.w, gw, "test");
  accumulate_grad(p.b, gb, "test");
  const float norm = clip_grad_norm({p.w, p.b}, 1.0f);
  CHECK(std::abs(norm - fixture().scalar("clip_norm")) <= kTol * fixture().scalar("clip_norm"));
  check_near(p.w.grad(), fixture().tensor("clip_gw"), "clipped w grad");
  check_near(p.b.grad(), fixture().tensor("clip_gb"), "clipped b grad");

  SUBCASE("a no-op below max_norm (and with max_norm = inf); returns the norm") {
    const auto w = p.w.grad().to_vector(), b = p.b.grad().to_vector();
    CHECK(std::abs(clip_grad_norm({p.w, p.b}, 100.0f) - 1.0) <= 1e-5);
    CHECK(clip_grad_norm({p.w, p.b}, std::numeric_limits<float>::infinity()) == doctest::Approx(1.0).epsilon(1e-5));
    CHECK(p.w.grad().to_vector() == w);
    CHECK(p.b.grad().to_vector() == b);
  }
  SUBCASE("parameters without a gradient are skipped") {
    p.b.zero_grad();
    double sq = 0;
    for (float v : p.w.grad().to_vector()) sq += double(v) * v;
    CHECK(clip_grad_norm({p.w, p.b}, 100.0f) == doctest::Approx(std::sqrt(sq)).epsilon(1e-6));
    CHECK_FALSE(p.b.has_grad());
  }
  SUBCASE("a non-finite norm is returned and nothing is scaled") {
    p.w.node()->grad.data()[5] = std::numeric_limits<float>::infinity();
    const auto b = p.b.grad().to_vector();
    CHECK(std::isinf(clip_grad_norm({p.w, p.b}, 1.0f)));
    CHECK(p.b.grad().to_vector() == b);
    p.w.node()->grad.data()[5] = std::numeric_limits<float>::quiet_NaN();
    CHECK(std::isnan(clip_grad_norm({p.w, p.b}, 1.0f)));
    CHECK(p.b.grad().to_vector() == b);
  }
  SUBCASE("a huge but finite gradient is clipped, not reported as an infinite norm") {
    p.w.node()->grad.data()[0] = 1e20f;  // its square overflows float
    const float norm = clip_grad_norm({p.w, p.b}, 1.0f);
    CHECK(norm == doctest::Approx(1e20).epsilon(1e-6));
    CHECK(p.w.grad().to_vector()[0] == doctest::Approx(1.0).epsilon(1e-5));
  }
  CHECK_THROWS_WITH_AS(clip_grad_norm({p.w}, 0.0f), "clip_grad_norm: max_norm must be > 0 (or +inf), got 0", Error);
}

TEST_CASE("cosine schedule matches nanoGPT's get_lr; linear and constant schedules") {
  CosineSchedule s(1e-3f, 10, 100, 1e-4f);
  const auto steps = fixture().tensor("cosine_steps").to_vector(), lrs = fixture().tensor("cosine_lr").to_vector();
  for (size_t i = 0; i < steps.size(); ++i) {
    CAPTURE(steps[i]);
    CHECK(std::abs(s.lr_at(static_cast<int64_t>(steps[i])) - lrs[i]) <= kTol * lrs[i]);
  }
  LinearSchedule lin(1.0f, 4, 14, 0.5f);
  CHECK(lin.lr_at(0) == doctest::Approx(0.2));  // (0 + 1) / (4 + 1)
  CHECK(lin.lr_at(3) == doctest::Approx(0.8));
  CHECK(lin.lr_at(4) == doctest::Approx(1.0));
  CHECK(lin.lr_at(9) == doctest::Approx(0.75));
  CHECK(lin.lr_at(14) == doctest::Approx(0.5));
  CHECK(lin.lr_at(1000) == doctest::Approx(0.5));
  CHECK(CosineSchedule(1.0f, 5, 5, 0.25f).lr_at(5) == doctest::Approx(0.25));  // no decay span: min_lr
  CHECK(ConstantSchedule(0.3f).lr_at(1000) == doctest::Approx(0.3));
  // Step: warmup as the others, lr until decay_iters, min_lr from it on (the copy task's 1e-3 -> 1e-4).
  StepSchedule step(1e-3f, 2, 1500, 1e-4f);
  CHECK(step.lr_at(0) == doctest::Approx(1e-3 / 3));
  CHECK(step.lr_at(2) == 1e-3f);
  CHECK(step.lr_at(1499) == 1e-3f);
  CHECK(step.lr_at(1500) == 1e-4f);
  CHECK(step.lr_at(100000) == 1e-4f);
  CHECK_THROWS_WITH_AS(step.lr_at(-1), "StepSchedule: step must be >= 0, got -1", Error);

  CHECK_THROWS_WITH_AS(CosineSchedule(1e-3f, 20, 10, 0), "CosineSchedule: warmup_iters (20) must be <= decay_iters (10)",
                       Error);
  CHECK_THROWS_WITH_AS(LinearSchedule(1e-3f, -1, 10, 0), "LinearSchedule: warmup_iters must be >= 0, got -1", Error);
  CHECK_THROWS_WITH_AS(CosineSchedule(1e-3f, 0, 10, 2e-3f), doctest::Contains("CosineSchedule: min_lr (0.002) must be in [0, lr (0.001)]"),
                       Error);
  CHECK_THROWS_WITH_AS(ConstantSchedule(-1.0f), "ConstantSchedule: lr must be finite and >= 0, got -1", Error);
  CHECK_THROWS_WITH_AS(s.lr_at(-1), "CosineSchedule: step must be >= 0, got -1", Error);
}

TEST_CASE("state round trip: a restored optimizer continues exactly like the uninterrupted one") {
  for (const auto& [case_name, make] : cases()) {
    const std::string& name = case_name;  // CAPTURE's lambda cannot take a binding (C++17)
    CAPTURE(name);
    Params a, b;
    auto oa = make(a);
    for (int i = 0; i < 2; ++i) a.set_grads(i, !skips_bias(name, i)), oa->step();
    // A checkpoint: values and state copied out, loaded into fresh objects.
    NamedTensors saved;
    for (const auto& [k, t] : oa->state_tensors()) saved.emplace_back(k, t.clone());
    b.w.value().copy_from(a.w.value());
    b.b.value().copy_from(a.b.value());
    auto ob = make(b);
    ob->load_state(saved, oa->step_count());
    CHECK(ob->step_count() == 2);
    a.set_grads(2), oa->step();
    b.set_grads(2), ob->step();
    CHECK(a.w.value().to_vector() == b.w.value().to_vector());
    CHECK(a.b.value().to_vector() == b.b.value().to_vector());
  }
}

TEST_CASE("state_tensors names per parameter; load_state validates before copying") {
  Params p;
  AdamW opt(decay_groups(p.named(), 0.01f, 0.1f));
  p.set_grads(0, /*bias=*/false);
  opt.step();
  const NamedTensors st = opt.state_tensors();
  std::vector<std::string> keys;
  for (const auto& kv : st) keys.push_back(kv.first);
  CHECK(keys == std::vector<std::string>{"step.w", "exp_avg.w", "exp_avg_sq.w", "step.b", "exp_avg.b", "exp_avg_sq.b"});
  CHECK(st[0].second.rank() == 0);
  CHECK(st[0].second.item() == 1);
  CHECK(st[3].second.item() == 0);  // b had no gradient: its state did not advance

  const auto m_before = st[1].second.to_vector();
  auto with = [&](const std::string& key, Tensor t) {
    NamedTensors s = st;
    for (auto& kv : s)
      if (kv.first == key) kv.second = t;
    return s;
  };
  const std::string pre = "AdamW optimizer state: ";
  CHECK_THROWS_WITH_AS(opt.load_state(with("exp_avg.w", Tensor::zeros({4, 3})), 1),
                       (pre + "'exp_avg.w' has shape [4, 3] vs parameter [3, 4]").c_str(), Error);
  NamedTensors missing(st.begin(), st.end() - 1);
  CHECK_THROWS_WITH_AS(opt.load_state(missing, 1), (pre + "missing 'exp_avg_sq.b' (shape [4])").c_str(), Error);
  NamedTensors extra = st;
  extra.emplace_back("momentum_buffer.w", Tensor::zeros({3, 4}));
  CHECK_THROWS_WITH_AS(opt.load_state(extra, 1), doctest::Contains((pre + "unexpected 'momentum_buffer.w'").c_str()), Error);
  NamedTensors dup = st;
  dup.push_back(st[1]);
  CHECK_THROWS_WITH_AS(opt.load_state(dup, 1), (pre + "duplicate 'exp_avg.w'").c_str(), Error);
  CHECK_THROWS_WITH_AS(opt.load_state(with("step.w", Tensor::scalar(1.5f)), 1),
                       (pre + "'step.w' must be a whole number in [0, step count 1], got 1.5").c_str(), Error);
  CHECK_THROWS_WITH_AS(opt.load_state(st, 0), doctest::Contains("'step.w' must be a whole number in [0, step count 0]"),
                       Error);
  CHECK_THROWS_WITH_AS(opt.load_state(st, -1), (pre + "step count must be >= 0, got -1").c_str(), Error);
  // Nothing was copied by the failed loads.
  CHECK(opt.state_tensors()[1].second.to_vector() == m_before);
  CHECK(opt.step_count() == 1);
  // A different optimizer's state is refused by name.
  SGD sgd(p.group(0.1f, 0), 0.9f);
  CHECK_THROWS_WITH_AS(sgd.load_state(st, 1), doctest::Contains("SGD optimizer state: missing 'momentum_buffer.w'"),
                       Error);
}

TEST_CASE("step skips parameters without a gradient; zero_grad, set_lr, lr, step_count") {
  Params p;
  AdamW opt(decay_groups(p.named(), 0.01f, 0.1f));
  p.w.zero_grad();
  p.b.zero_grad();
  accumulate_grad(p.b, Tensor::ones({4}), "test");
  const auto w_before = p.w.value().to_vector();
  opt.step();
  CHECK(p.w.value().to_vector() == w_before);  // no decoupled decay either
  CHECK(p.b.value().to_vector() != fixture().tensor("b0").to_vector());
  CHECK(opt.step_count() == 1);
  opt.zero_grad();
  CHECK_FALSE(p.w.has_grad());
  CHECK_FALSE(p.b.has_grad());
  opt.set_lr(0.5f);
  CHECK(opt.lr() == 0.5f);
  for (const ParamGroup& g : opt.groups()) CHECK(g.lr == 0.5f);
  CHECK(opt.groups()[0].weight_decay == 0.1f);  // set_lr keeps each group's decay
  CHECK_THROWS_WITH_AS(opt.set_lr(-1.0f), "AdamW: lr must be finite and >= 0, got -1", Error);
}

TEST_CASE("constructors name the bad hyperparameter or parameter") {
  Params p;
  CHECK_THROWS_WITH_AS(AdamW(p.group(0.01f, 0), 1.0f), "AdamW: beta1 must be in [0, 1), got 1", Error);
  CHECK_THROWS_WITH_AS(Adam(p.group(0.01f, 0), 0.9f, -0.5f), "Adam: beta2 must be in [0, 1), got -0.5", Error);
  CHECK_THROWS_WITH_AS(Adam(p.group(0.01f, 0), 0.9f, 0.999f, 0.0f), "Adam: eps must be finite and > 0, got 0", Error);
  CHECK_THROWS_WITH_AS(SGD(p.group(-0.1f, 0)), "SGD: group 0 lr must be finite and >= 0, got -0.1", Error);
  CHECK_THROWS_WITH_AS(SGD(p.group(0.1f, -1.0f)), "SGD: group 0 weight_decay must be finite and >= 0, got -1", Error);
  CHECK_THROWS_WITH_AS(SGD(p.group(0.1f, 0), -0.9f), "SGD: momentum must be finite and >= 0, got -0.9", Error);
  CHECK_THROWS_WITH_AS(SGD(p.group(0.1f, 0), 0.0f, 0.0f, true),
                       "SGD: nesterov requires momentum > 0 and dampening 0, got momentum 0, dampening 0", Error);
  CHECK_THROWS_WITH_AS(SGD(p.group(0.1f, 0), 0.9f, 0.1f, true), doctest::Contains("dampening 0.1"), Error);
  CHECK_THROWS_WITH_AS(SGD({{{{"w", p.w}}, 0.1f, 0}, {{{"w2", p.w}}, 0.1f, 0}}),
                       "SGD: the same parameter appears as 'w' and 'w2'", Error);
  CHECK_THROWS_WITH_AS(SGD({{{{"w", p.w}}, 0.1f, 0}, {{{"w", p.b}}, 0.1f, 0}}),
                       "SGD: parameter name 'w' appears twice (groups 0 and 1)", Error);
  CHECK_THROWS_WITH_AS(SGD({{{}, 0.1f, 0}}), "SGD: got an empty parameter list", Error);
  Var strided(Tensor::zeros({4, 3}).transpose(0, 1), true);
  CHECK_THROWS_WITH_AS(SGD({{{{"t", strided}}, 0.1f, 0}}), doctest::Contains("SGD: parameter 't' must be contiguous"),
                       Error);
}

TEST_CASE("decay_groups splits by rank like nanoGPT's configure_optimizers") {
  Var emb(Tensor::zeros({5, 2}), true), w(Tensor::zeros({2, 3, 4}), true), bias(Tensor::zeros({3}), true);
  Var gain(Tensor::ones({3}), true), frozen(Tensor::zeros({2, 2}), false);
  const auto groups = decay_groups({{"emb", emb}, {"ln.gain", gain}, {"w", w}, {"frozen", frozen}, {"bias", bias}},
                                   3e-4f, 0.1f);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].weight_decay == 0.1f);
  CHECK(groups[1].weight_decay == 0.0f);
  CHECK(groups[0].lr == 3e-4f);
  CHECK(groups[1].lr == 3e-4f);
  REQUIRE(groups[0].params.size() == 2);
  CHECK(groups[0].params[0].first == "emb");
  CHECK(groups[0].params[1].first == "w");
  REQUIRE(groups[1].params.size() == 2);
  CHECK(groups[1].params[0].first == "ln.gain");
  CHECK(groups[1].params[1].first == "bias");
  CHECK(decay_groups({{"bias", bias}}, 1e-3f, 0.1f).size() == 1);  // no empty group
}

TEST_CASE("large parameters: the blocked parallel update is per-element and thread-count independent") {
  // n spans several blocks with a ragged tail; the split point 1000 is not a block multiple.
  const int64_t n = 3 * Optimizer::kBlock + 100, cut = 1000;
  std::vector<Scalar> w(n), g1(n), g2(n);
  for (int64_t i = 0; i < n; ++i) {
    w[i] = static_cast<Scalar>(std::sin(0.37 * i));
    g1[i] = static_cast<Scalar>(std::cos(0.11 * i));
    g2[i] = static_cast<Scalar>(std::sin(0.05 * i + 1));
  }
  auto run_whole = [&](int threads) {
    parallel::set_num_threads(threads);
    Var v(Tensor::from({n}, w), true);
    AdamW opt({{{{"v", v}}, 0.01f, 0.1f}}, 0.9f, 0.99f);
    for (const auto& g : {g1, g2}) v.zero_grad(), accumulate_grad(v, Tensor::from({n}, g), "test"), opt.step();
    return v.value().to_vector();
  };
  const auto one = run_whole(1), two = run_whole(2);
  parallel::set_num_threads(0);
  CHECK(one == two);

  // The same elements as two separate parameters give the same values.
  auto slice = [](const std::vector<Scalar>& x, int64_t a, int64_t b) {
    return std::vector<Scalar>(x.begin() + a, x.begin() + b);
  };
  Var head(Tensor::from({cut}, slice(w, 0, cut)), true), tail(Tensor::from({n - cut}, slice(w, cut, n)), true);
  AdamW opt({{{{"head", head}, {"tail", tail}}, 0.01f, 0.1f}}, 0.9f, 0.99f);
  for (const auto& g : {g1, g2}) {
    head.zero_grad(), tail.zero_grad();
    accumulate_grad(head, Tensor::from({cut}, slice(g, 0, cut)), "test");
    accumulate_grad(tail, Tensor::from({n - cut}, slice(g, cut, n)), "test");
    opt.step();
  }
  check_near(head.value(), Tensor::from({cut}, slice(one, 0, cut)), "head");
  check_near(tail.value(), Tensor::from({n - cut}, slice(one, cut, n)), "tail");

  // Clipping a large gradient: same norm for any thread count.
  auto norm_with = [&](int threads) {
    parallel::set_num_threads(threads);
    Var v(Tensor::from({n}, w), true);
    accumulate_grad(v, Tensor::from({n}, g1), "test");
    return clip_grad_norm({v}, 1.0f);
  };
  const float n1 = norm_with(1), n2 = norm_with(2);
  parallel::set_num_threads(0);
  CHECK(n1 == n2);
}

TEST_CASE("step(clip_coefficient(grad_norm)) equals clip_grad_norm then step(), for every optimizer") {
  for (const auto& [case_name, make] : cases()) {
    const std::string& name = case_name;  // CAPTURE's lambda cannot take a binding (C++17)
    CAPTURE(name);
    Params in_place, folded;
    auto a = make(in_place), b = make(folded);
    for (int i = 0; i < 3; ++i) {
      in_place.set_grads(i, !skips_bias(name, i));
      folded.set_grads(i, !skips_bias(name, i));
      for (Var* v : {&in_place.w, &in_place.b, &folded.w, &folded.b}) {  // norm ~3.3: clipping is active
        if (!v->has_grad()) continue;
        Tensor& g = v->node()->grad;
        for (int64_t k = 0; k < g.numel(); ++k) g.data()[k] *= 3;
      }
      const float max_norm = 0.5f;
      const float n1 = clip_grad_norm({in_place.w, in_place.b}, max_norm);
      a->step();
      const float n2 = grad_norm({folded.w, folded.b});
      REQUIRE(clip_coefficient(n2, max_norm) < 1.0f);
      b->step(clip_coefficient(n2, max_norm));
      CHECK(n1 == n2);
      // The same float product g * coef feeds the same update: identical bits.
      CHECK(in_place.w.value().to_vector() == folded.w.value().to_vector());
      CHECK(in_place.b.value().to_vector() == folded.b.value().to_vector());
    }
  }
}

TEST_CASE("clip_coefficient: PyTorch's max_norm / (norm + 1e-6), capped at 1; 1 for a non-finite norm") {
  CHECK(clip_coefficient(4.0f, 1.0f) == 1.0f / (4.0f + 1e-6f));
  CHECK(clip_coefficient(0.5f, 1.0f) == 1.0f);
  CHECK(clip_coefficient(3.0f, std::numeric_limits<float>::infinity()) == 1.0f);
  CHECK(clip_coefficient(std::numeric_limits<float>::quiet_NaN(), 1.0f) == 1.0f);
  CHECK_THROWS_WITH_AS(clip_coefficient(1.0f, -1.0f), "clip_coefficient: max_norm must be > 0 (or +inf), got -1",
                       Error);
  Params p;
  p.set_grads(0);
  auto opt = std::make_unique<AdamW>(p.group(0.01f, 0.1f));
  CHECK_THROWS_WITH_AS(opt->step(0.0f), "AdamW: grad_scale must be finite and > 0, got 0", Error);
  CHECK(opt->step_count() == 0);
}
