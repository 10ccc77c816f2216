// Compose first, fuse second: each fused op in autograd/ops/nn.cpp gives the
// values and gradients of the primitives it replaces (add, mul, mean, exp,
// ...), on strided inputs too. (causal_attention and feed_forward have the
// same test in tests/layers/test_layers.cpp.)
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/rng.h"
#include "golden.h"

using namespace tapeformer;

namespace {

using Fn = std::function<Var(const std::vector<Var>&)>;

constexpr double kFusedTol = 2e-6;  // |fused - composed| <= kFusedTol * max(1, |composed|); NaN fails

Tensor random(Shape s, Rng& rng, float scale = 1.0f) {
  Tensor t = Tensor::empty(s);
  rng.fill_normal(t, 0.0f, scale);
  return t;
}

// Runs both on fresh copies of `inputs` with the same upstream gradient and
// compares outputs and every input's gradient.
void check_fused_equals_composed(const Fn& fused, const Fn& composed, const std::vector<Tensor>& inputs,
                                 uint64_t seed) {
  auto vars = [&] {
    std::vector<Var> v;
    for (const Tensor& t : inputs) v.emplace_back(t.clone(), true);
    return v;
  };
  std::vector<Var> a = vars(), b = vars();
  Var fa, fb;
  Tensor upstream;
  {
    TapeScope tape;
    fa = fused(a);
    Rng rng(seed);
    upstream = fa.numel() == 1 ? Tensor::ones(fa.shape()) : random(fa.shape(), rng);
    backward(fa, upstream);
  }
  {
    TapeScope tape;
    fb = composed(b);
    backward(fb, upstream);
  }
  check_close(fa.value(), fb.value(), "value", kFusedTol);
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    REQUIRE(a[i].has_grad());
    REQUIRE(b[i].has_grad());
    check_close(a[i].grad(), b[i].grad(), "gradient of input " + std::to_string(i), kFusedTol);
  }
}

Var composed_log_softmax(const Var& x) {
  const Var shifted = sub(x, detach(max(x, -1, true)));  // the shift cancels in the gradient
  return sub(shifted, log(sum(exp(shifted), {-1}, true)));
}

}  // namespace

TEST_CASE("layer_norm equals mean / variance / scale / shift composed") {
  Rng rng(11);
  const Scalar eps = 1e-5f;
  const Fn fused = [&](const std::vector<Var>& v) { return layer_norm(v[0], v[1], v[2], eps); };
  const Fn composed = [&](const std::vector<Var>& v) {
    const Var xc = sub(v[0], mean(v[0], {-1}, true));
    const Var var = mean(mul(xc, xc), {-1}, true);  // biased, as LayerNorm uses
    return add(mul(div(xc, sqrt(add_scalar(var, eps))), v[1]), v[2]);
  };
  // Offset inputs: a mean far from 0 is where a missing centring term shows.
  const Tensor x = add_scalar(Var(random({3, 5, 12}, rng)), 3.0f).value();
  check_fused_equals_composed(fused, composed, {x, random({12}, rng), random({12}, rng)}, 1);
  // A transposed (strided) input.
  check_fused_equals_composed(fused, composed,
                              {random({3, 12, 5}, rng).transpose(1, 2), random({12}, rng), random({12}, rng)}, 2);
}

TEST_CASE("rms_norm equals root-mean-square / scale composed") {
  Rng rng(12);
  const Scalar eps = 1e-5f;
  const Fn fused = [&](const std::vector<Var>& v) { return rms_norm(v[0], v[1], eps); };
  const Fn composed = [&](const std::vector<Var>& v) {
    return mul(div(v[0], sqrt(add_scalar(mean(mul(v[0], v[0]), {-1}, true), eps))), v[1]);
  };
  check_fused_equals_composed(fused, composed, {random({4, 7, 10}, rng), random({10}, rng)}, 3);
  check_fused_equals_composed(fused, composed, {random({4, 10, 7}, rng).transpose(1, 2), random({10}, rng)}, 4);
}

TEST_CASE("softmax and log_softmax equal exp / sum / log composed") {
  Rng rng(13);
  const Fn composed_softmax = [](const std::vector<Var>& v) {
    const Var e = exp(sub(v[0], detach(max(v[0], -1, true))));
    return div(e, sum(e, {-1}, true));
  };
  const Tensor x = random({2, 6, 9}, rng, 3.0f);
  check_fused_equals_composed([](const std::vector<Var>& v) { return softmax(v[0]); }, composed_softmax, {x}, 5);
  check_fused_equals_composed([](const std::vector<Var>& v) { return log_softmax(v[0]); },
                              [](const std::vector<Var>& v) { return composed_log_softmax(v[0]); }, {x}, 6);
}

TEST_CASE("cross_entropy equals -mean(log_softmax picked by one-hot targets), ignored rows left out") {
  Rng rng(14);
  const int64_t B = 3, T = 5, V = 11;
  std::vector<int32_t> ids(B * T);
  for (auto& id : ids) id = static_cast<int32_t>(rng.below(V));
  ids[2] = ids[7] = -100;  // ignored: no loss, no gradient
  const IndexTensor targets({B, T}, ids);
  std::vector<Scalar> onehot(B * T * V, 0.0f);
  int counted = 0;
  for (int64_t r = 0; r < B * T; ++r)
    if (ids[r] >= 0) onehot[r * V + ids[r]] = 1.0f, ++counted;
  const Tensor picks = Tensor::from({B, T, V}, onehot);
  const Fn fused = [&](const std::vector<Var>& v) { return cross_entropy(v[0], targets); };
  const Fn composed = [&](const std::vector<Var>& v) {
    return mul_scalar(sum(mul(composed_log_softmax(v[0]), Var(picks))), -1.0f / counted);
  };
  check_fused_equals_composed(fused, composed, {random({B, T, V}, rng, 2.0f)}, 7);
  check_fused_equals_composed(fused, composed, {random({B, V, T}, rng, 2.0f).transpose(1, 2)}, 8);
}
