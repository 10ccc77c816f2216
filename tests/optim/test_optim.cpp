// Optimizers, clipping and schedules against PyTorch (tests/fixtures/optim_golden.txt,
// made by tests/fixtures/make_optim_golden.py), plus state round trips and errors.
#include <doctest/doctest.h>

#include "core/error.h"
#include "autograd/tape.h"
#include "golden.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace {

const Golden& fixture() {
  static const Golden g = load_golden_file(std::string(TAPEFORMER_FIXTURE_DIR) + "/optim_golden.txt");
  return g;
}

struct Params {
  Var w, b;
  Params() : w(fixture().tensor("w0").clone(), true, "w"), b(fixture().tensor("b0").clone(), true, "b") {}
  NamedVars named() const { return {{"w", w}, {"b", b}}; }
  void set_grads(int i) {
    w.zero_grad();
    b.zero_grad();
    accumulate_grad(w, fixture().tensor("gw" + std::to_string(i)).clone(), "test");
    accumulate_grad(b, fixture().tensor("gb" + std::to_string(i)).clone(), "test");
  }
};

template <class MakeOptimizer>
void check_against_torch(const std::string& name, MakeOptimizer make) {
  Params p;
  auto opt = make(p);
  for (int i = 0; i < 3; ++i) {
    p.set_grads(i);
    opt->step();
    check_close(p.w.value(), fixture().tensor(name + "_w" + std::to_string(i)), name + " w step " + std::to_string(i));
    check_close(p.b.value(), fixture().tensor(name + "_b" + std::to_string(i)), name + " b step " + std::to_string(i));
  }
}

}  // namespace

TEST_CASE("SGD, SGD+Nesterov, Adam and AdamW match PyTorch for three steps") {
  check_against_torch("sgd", [](Params& p) { return std::make_unique<SGD>(std::vector<ParamGroup>{{p.named(), 0.1f, 0}}); });
  check_against_torch("sgd_nesterov", [](Params& p) {
    return std::make_unique<SGD>(std::vector<ParamGroup>{{p.named(), 0.1f, 0.01f}}, 0.9f, 0.0f, true);
  });
  check_against_torch("adam", [](Params& p) {
    return std::make_unique<Adam>(std::vector<ParamGroup>{{p.named(), 0.01f, 0.01f}}, 0.9f, 0.999f, 1e-8f);
  });
  check_against_torch("adamw", [](Params& p) {
    // decay_groups: w (rank 2) decays, b (rank 1) does not, as in the fixture's two groups.
    return std::make_unique<AdamW>(decay_groups(p.named(), 0.01f, 0.1f), 0.9f, 0.99f, 1e-8f);
  });
}

TEST_CASE("clip_grad_norm matches torch.nn.utils.clip_grad_norm_ and is a no-op below max_norm") {
  Params p;
  p.w.zero_grad();
  p.b.zero_grad();
  Tensor gw = fixture().tensor("gw0").clone(), gb = fixture().tensor("gb0").clone();
  for (Tensor* t : {&gw, &gb})
    for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] *= 3;
  accumulate_grad(p.w, gw, "test");
  accumulate_grad(p.b, gb, "test");
  const float norm = clip_grad_norm({p.w, p.b}, 1.0f);
  CHECK(norm == doctest::Approx(fixture().scalar("clip_norm")).epsilon(1e-6));
  check_close(p.w.grad(), fixture().tensor("clip_gw"), "clipped w grad");
  check_close(p.b.grad(), fixture().tensor("clip_gb"), "clipped b grad");
  const auto before = p.w.grad().to_vector();
  CHECK(clip_grad_norm({p.w, p.b}, 100.0f) == doctest::Approx(1.0).epsilon(1e-5));
  CHECK(p.w.grad().to_vector() == before);
}

TEST_CASE("cosine schedule matches nanoGPT's get_lr") {
  CosineSchedule s(1e-3f, 10, 100, 1e-4f);
  const auto steps = fixture().tensor("cosine_steps").to_vector(), lrs = fixture().tensor("cosine_lr").to_vector();
  for (size_t i = 0; i < steps.size(); ++i)
    CHECK(s.lr_at(static_cast<int64_t>(steps[i])) == doctest::Approx(lrs[i]).epsilon(1e-6));
  LinearSchedule lin(1.0f, 0, 10, 0.0f);
  CHECK(lin.lr_at(5) == doctest::Approx(0.5));
  CHECK(ConstantSchedule(0.3f).lr_at(1000) == doctest::Approx(0.3));
  CHECK_THROWS_WITH_AS(CosineSchedule(1e-3f, 20, 10, 0), doctest::Contains("warmup (20) <= decay_iters (10)"), Error);
}

TEST_CASE("optimizer state round trip: a restored AdamW continues exactly") {
  Params a, b;
  AdamW oa(decay_groups(a.named(), 0.01f, 0.1f), 0.9f, 0.99f, 1e-8f);
  for (int i = 0; i < 2; ++i) a.set_grads(i), oa.step();
  // b gets a's parameters and optimizer state, then both take step 3.
  b.w.value().copy_from(a.w.value());
  b.b.value().copy_from(a.b.value());
  AdamW ob(decay_groups(b.named(), 0.01f, 0.1f), 0.9f, 0.99f, 1e-8f);
  ob.load_state(oa.state_tensors(), oa.step_count());
  a.set_grads(2), oa.step();
  b.set_grads(2), ob.step();
  CHECK(a.w.value().to_vector() == b.w.value().to_vector());
  CHECK(a.b.value().to_vector() == b.b.value().to_vector());
  CHECK(oa.state_tensors()[0].first == "exp_avg.w");

  NamedTensors st = oa.state_tensors();
  st[0].second = Tensor::zeros({4, 3});
  CHECK_THROWS_WITH_AS(ob.load_state(st, 2), "AdamW state: 'exp_avg.w' has shape [4, 3] but the parameter is [3, 4]",
                       Error);
  st.pop_back();
  CHECK_THROWS_WITH_AS(ob.load_state(st, 2), doctest::Contains("3 tensors, expected 4"), Error);
}

TEST_CASE("parameters without a gradient are untouched; bad hyperparameters are named") {
  Params p;
  AdamW opt(decay_groups(p.named(), 0.01f, 0.1f));
  p.w.zero_grad();
  p.b.zero_grad();
  accumulate_grad(p.b, Tensor::ones({4}), "test");
  const auto w_before = p.w.value().to_vector();
  opt.step();
  CHECK(p.w.value().to_vector() == w_before);
  CHECK(p.b.value().to_vector() != fixture().tensor("b0").to_vector());
  CHECK_THROWS_WITH_AS(AdamW(decay_groups(p.named(), 0.01f, 0.1f), 1.0f), "AdamW: beta1 must be in [0, 1), got 1", Error);
  CHECK_THROWS_WITH_AS(SGD(decay_groups(p.named(), 0.1f, 0), 0.0f, 0.0f, true),
                       doctest::Contains("SGD: nesterov needs momentum > 0"), Error);
  CHECK_THROWS_WITH_AS(Adam(decay_groups(p.named(), 0.01f, 0), 0.9f, 0.999f, 0.0f), "Adam: eps must be > 0, got 0", Error);
}
