// Score modifiers in the attention kernel (core/kernels/score_mods.h): a map
// written outside the library (examples/custom_attention's soft cap), a
// learned term and a learned map, each equal to the composition of primitive
// ops it stands for (values and gradients, parameters' included), gradchecked,
// and bit-identical for any thread count.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/parallel.h"
#include "golden.h"
#include "op_runs.h"
#include "../examples/custom_attention/softcap.h"

using namespace tapeformer;

namespace {

constexpr Scalar kInf = std::numeric_limits<Scalar>::infinity();

// s + w_h: one learned scalar per head added to every score of the head.
class HeadBias : public kernels::ScoreTerm {
 public:
  explicit HeadBias(const Tensor& w) : w_(w.contiguous()) {}
  void add(const kernels::ScoreRow& r, Scalar* sum) const override {
    for (int64_t x = 0; x < r.n; ++x) sum[x] += w_.data()[r.h];
  }
  int64_t partial_size() const override { return 1; }
  void add_gradient(const kernels::ScoreRow& r, const Scalar* ds, Scalar* part) const override {
    for (int64_t x = 0; x < r.n; ++x) part[0] += ds[x];
  }
  void fold_gradient(int64_t, int64_t h, const Scalar* part, Scalar* grad) const override { grad[h] += part[0]; }

 private:
  Tensor w_;  // (H)
};

// s -> a_h s: a learned scale per head, applied after the terms.
class HeadScale : public kernels::ScoreMap {
 public:
  explicit HeadScale(const Tensor& a) : a_(a.contiguous()) {}
  void apply(const kernels::ScoreRow& r, Scalar* s) const override {
    for (int64_t x = 0; x < r.n; ++x) s[x] *= a_.data()[r.h];
  }
  int64_t partial_size() const override { return 1; }
  void backward(const kernels::ScoreRow& r, const Scalar* in, Scalar* ds, Scalar* part) const override {
    for (int64_t x = 0; x < r.n; ++x) {
      if (part) part[0] += ds[x] * in[x];
      ds[x] *= a_.data()[r.h];
    }
  }
  void fold_gradient(int64_t, int64_t h, const Scalar* part, Scalar* grad) const override { grad[h] += part[0]; }

 private:
  Tensor a_;  // (H)
};

// [Tq, Tk]: 1 where key j is after query i (queries are the last Tq positions).
Tensor future(int64_t Tq, int64_t Tk) {
  Tensor m = Tensor::zeros({Tq, Tk});
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t j = Tk - Tq + i + 1; j < Tk; ++j) m.at({i, j}) = 1.0f;
  return m;
}

// ALiBi-like constant term (1, H, 1, Tk): -0.1 (h + 1) (Tk - j).
Tensor slope_bias(int64_t H, int64_t Tk) {
  Tensor b = Tensor::empty({1, H, 1, Tk});
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < Tk; ++j) b.at({0, h, 0, j}) = -0.1f * static_cast<Scalar>((h + 1) * (Tk - j));
  return b;
}

// scores = q k^T / sqrt(D) + bias, causal, softmax, times v.
Var composed(const Var& q, const Var& k, const Var& v, const Tensor& bias,
             const std::function<Var(const Var&)>& modify) {
  const int64_t Tq = q.dim(2), Tk = k.dim(2);
  Var s = add(mul_scalar(matmul(q, transpose(k, 2, 3)), 1.0f / std::sqrt(static_cast<Scalar>(q.dim(3)))), Var(bias));
  s = masked_fill(modify(s), future(Tq, Tk), -kInf);
  return matmul(softmax(s), v);
}

void check_runs_close(const Run& a, const Run& b, double tol) {
  check_close(a.y, b.y, "value", tol);
  REQUIRE(a.grads.size() == b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) check_close(a.grads[i], b.grads[i], "gradient " + std::to_string(i), tol);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const std::vector<Scalar> x = a.to_vector(), y = b.to_vector();
  return a.shape() == b.shape() && std::memcmp(x.data(), y.data(), x.size() * sizeof(Scalar)) == 0;
}

}  // namespace

TEST_CASE("a soft cap written outside the library runs in the kernel and equals c tanh(s / c) composed") {
  // 70 queries after 20 cached keys: two query tiles, keys over two tiles, a constant term first.
  const int64_t B = 2, H = 2, Tq = 70, Tk = 90, D = 8;
  const Scalar c = 1.5f;  // small: most scores are well into tanh's curve
  Rng rng(11);
  const Tensor q = random({B, H, Tq, D}, rng, 2.0f), k = random({B, H, Tk, D}, rng, 2.0f),
               v = random({B, H, Tk, D}, rng), R = random({B, H, Tq, D}, rng);
  const Tensor bias = slope_bias(H, Tk);
  const auto cap = std::make_shared<softcap::SoftCap>(c);
  const Run lean = run(
      [&](const std::vector<Var>& x) {
        AttentionSpec spec;
        spec.bias = {bias};
        spec.maps = {{cap}};
        return softmax_attention(x[0], x[1], x[2], spec);
      },
      {q, k, v}, R);
  const Run reference = run(
      [&](const std::vector<Var>& x) {
        return composed(x[0], x[1], x[2], bias, [&](const Var& s) { return mul_scalar(tanh(mul_scalar(s, 1 / c)), c); });
      },
      {q, k, v}, R);
  check_runs_close(lean, reference, 1e-5);
  // Without the cap the output differs: the map is applied, not skipped.
  const Run plain = run(
      [&](const std::vector<Var>& x) {
        AttentionSpec spec;
        spec.bias = {bias};
        return softmax_attention(x[0], x[1], x[2], spec);
      },
      {q, k, v}, R);
  const std::vector<Scalar> a = plain.y.to_vector(), b = lean.y.to_vector();
  double most = 0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, std::abs(static_cast<double>(a[i]) - b[i]));
  CHECK(most > 1e-2);
}

TEST_CASE("the soft cap's gradient through the kernel passes gradcheck") {
  const auto cap = std::make_shared<softcap::SoftCap>(1.0f);
  Rng rng(5);
  const Tensor q = random({1, 2, 6, 3}, rng, 1.5f), k = random({1, 2, 9, 3}, rng, 1.5f), v = random({1, 2, 9, 2}, rng);
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Var>& x) {
        AttentionSpec spec;
        spec.maps = {{cap}};
        return softmax_attention(x[0], x[1], x[2], spec);
      },
      {q, k, v}, "softcap through softmax_attention");
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("a learned term and a learned map get their gradients from the kernel's backward") {
  const int64_t B = 2, H = 3, T = 75, D = 4;
  Rng rng(7);
  const Tensor q = random({B, H, T, D}, rng), k = random({B, H, T, D}, rng), v = random({B, H, T, D}, rng),
               R = random({B, H, T, D}, rng);
  const Tensor w = Tensor::from({H}, {0.3f, -0.7f, 1.1f}), a = Tensor::from({H}, {0.8f, 1.3f, 0.5f});
  const auto lean = [&](const std::vector<Var>& x) {
    AttentionSpec spec;
    spec.terms = {{std::make_shared<HeadBias>(x[3].value()), x[3]}};
    spec.maps = {{std::make_shared<HeadScale>(x[4].value()), x[4]}};
    return softmax_attention(x[0], x[1], x[2], spec);
  };
  const auto reference = [&](const std::vector<Var>& x) {
    return composed(x[0], x[1], x[2], Tensor::zeros({1, 1, 1, 1}), [&](const Var& s) {
      return mul(add(s, reshape(x[3], {1, H, 1, 1})), reshape(x[4], {1, H, 1, 1}));
    });
  };
  const Run got = run(lean, {q, k, v, w, a}, R);
  check_runs_close(got, run(reference, {q, k, v, w, a}, R), 2e-5);
  // The parameters' gradients, summed per (b, h, query tile) and folded in a fixed order: the same bits on 1, 2 and 3 threads.
  const int before = parallel::num_threads();
  for (int threads : {1, 3}) {
    parallel::set_num_threads(threads);
    const Run other = run(lean, {q, k, v, w, a}, R);
    for (size_t i = 0; i < got.grads.size(); ++i) CHECK(bitwise_equal(got.grads[i], other.grads[i]));
  }
  parallel::set_num_threads(before);
  GradcheckOptions opt;
  opt.label = "learned term and map";
  const GradcheckResult r = gradcheck(lean, {random({1, H, 7, 3}, rng), random({1, H, 7, 3}, rng),
                                             random({1, H, 7, 2}, rng), w, a},
                                      opt);
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("a map sees finite scores only: a -inf term stays -inf, and a row with every key hidden gives 0") {
  const int64_t T = 5;
  Rng rng(3);
  const Tensor q = random({1, 1, T, 4}, rng), k = random({1, 1, T, 4}, rng), v = random({1, 1, T, 4}, rng);
  Tensor padding = Tensor::zeros({1, 1, 1, T});  // key 1 padded away
  padding.at({0, 0, 0, 1}) = -kInf;
  AttentionSpec spec;
  spec.bias = {padding};
  spec.maps = {{std::make_shared<softcap::SoftCap>(2.0f)}};  // tanh(-inf) would give -2, a finite score
  const Var y = softmax_attention(Var(q), Var(k), Var(v), spec);
  // Query 1 sees keys 0 and 1; key 1 is padded, so it reads key 0 alone: y_1 = v_0.
  for (int64_t d = 0; d < 4; ++d) CHECK(y.value().at({0, 0, 1, d}) == doctest::Approx(v.at({0, 0, 0, d})).epsilon(1e-6));
}

namespace {

// Fails its check: a modifier for 4 heads.
class FourHeads : public kernels::ScoreTerm {
 public:
  void check(int64_t, int64_t H, int64_t, int64_t) const override {
    TAPEFORMER_CHECK(H == 4, "FourHeads: made for 4 heads, q has ", H);
  }
  void add(const kernels::ScoreRow&, Scalar*) const override {}
};

}  // namespace

TEST_CASE("a modifier that does not fit the attention is refused by its own check, and a null one by name") {
  Rng rng(1);
  const Var q(random({1, 2, 3, 4}, rng));
  AttentionSpec spec;
  spec.terms = {{std::make_shared<FourHeads>()}};
  CHECK_THROWS_WITH_AS(softmax_attention(q, q, q, spec), doctest::Contains("FourHeads: made for 4 heads, q has 2"),
                       Error);
  AttentionSpec null_map;
  null_map.maps = {{nullptr}};
  CHECK_THROWS_WITH_AS(softmax_attention(q, q, q, null_map), doctest::Contains("softmax_attention: a score map is null"),
                       Error);
}
