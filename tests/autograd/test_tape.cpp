#include <doctest/doctest.h>

#include <cmath>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "sampling_stats.h"

using namespace tapeformer;

TEST_CASE("backward accumulates through shared uses and clears the tape") {
  Var x(Tensor::from({3}, {1, 2, 3}), true);
  Var y = add(mul(x, x), x);  // dy/dx = 2x + 1
  backward(sum(y));
  CHECK(x.grad().to_vector() == std::vector<Scalar>{3, 5, 7});
  CHECK(current_tape().empty());
  // A second pass accumulates; zeroing belongs to the caller (optimizer).
  backward(sum(mul_scalar(x, 2.0f)));
  CHECK(x.grad().to_vector() == std::vector<Scalar>{5, 7, 9});
  x.zero_grad();
  CHECK_FALSE(x.has_grad());
}

TEST_CASE("an intermediate's gradient is its own after backward (inputs never adopt it)") {
  // add passes its output gradient through to both inputs; the accumulator
  // must not adopt that buffer and then add into it.
  Var x(Tensor::from({2}, {1, 2}), true);
  Var y = add(x, x);
  backward(y, Tensor::from({2}, {3, 4}));
  CHECK(y.grad().to_vector() == std::vector<Scalar>{3, 4});
  CHECK(x.grad().to_vector() == std::vector<Scalar>{6, 8});

  Var a(Tensor::from({1}, {2}), true);
  Var h = mul_scalar(a, 1.0f);
  Var o = add(h, exp(h));  // do/dh = 1 + exp(h)
  backward(sum(o));
  CHECK(o.grad().to_vector() == std::vector<Scalar>{1});
  CHECK(h.grad().item() == doctest::Approx(1 + std::exp(2.0)).epsilon(1e-6));
  CHECK(a.grad().item() == doctest::Approx(1 + std::exp(2.0)).epsilon(1e-6));
}

TEST_CASE("NoGradGuard records nothing and results do not require grad") {
  Var x(Tensor::ones({2, 2}), true);
  {
    NoGradGuard guard;
    Var y = exp(x);
    CHECK_FALSE(y.requires_grad());
    CHECK(current_tape().empty());
  }
  CHECK(exp(x).requires_grad());
  current_tape().clear();
}

TEST_CASE("saved tensors are freed after backward") {
  const int64_t before_count = Storage::live_count();
  const int64_t before_bytes = Storage::live_bytes();
  {
    Var w(Tensor::ones({64, 64}), true);
    const int64_t with_params = Storage::live_count();
    {
      Var h = Var(Tensor::ones({8, 64}));
      for (int i = 0; i < 4; ++i) h = gelu(layer_norm(matmul(h, w), Var(), Var()));
      Var loss = mean(h);
      CHECK(Storage::live_count() > with_params + 8);  // activations held by the tape
      backward(loss);
    }
    // Only w and its gradient remain.
    CHECK(Storage::live_count() == with_params + 1);
    CHECK(w.has_grad());
  }
  CHECK(Storage::live_count() == before_count);
  CHECK(Storage::live_bytes() == before_bytes);
}

TEST_CASE("TapeScope: a nested tape differentiates a sub-computation independently") {
  Var a(Tensor::from({2}, {1, 2}), true);
  Var outer = mul_scalar(a, 3.0f);  // recorded on the default tape
  const size_t outer_entries = current_tape().size();
  {
    TapeScope local;
    Var b(Tensor::from({2}, {4, 5}), true);
    Var inner = mul(b, b);
    CHECK(local.tape().size() == 1);
    backward(inner, Tensor::ones({2}));
    CHECK(b.grad().to_vector() == std::vector<Scalar>{8, 10});
    CHECK(local.tape().empty());
  }
  CHECK(current_tape().size() == outer_entries);
  backward(sum(outer));
  CHECK(a.grad().to_vector() == std::vector<Scalar>{3, 3});
}

TEST_CASE("a nested tape opened inside a backward pass records and runs") {
  // Simulates a custom backward that re-runs f(x) = x^3 and differentiates it,
  // as reversible blocks do.
  Var x(Tensor::from({2}, {1, 2}), true);
  Var y = mul_scalar(x, 1.0f);
  Tensor recomputed_grad;
  record_backward(y, [x, &recomputed_grad](const Tensor& g) {
    TapeScope local;
    Var xr(x.value(), true);
    Var f = pow(xr, 3.0f);
    backward(f, g);
    recomputed_grad = xr.grad();
  });
  backward(sum(y));
  CHECK(recomputed_grad.to_vector() == std::vector<Scalar>{3, 12});
}

TEST_CASE("operations on views: gradient lands in the right elements") {
  Var x(Tensor::from({2, 3}, {1, 2, 3, 4, 5, 6}), true);
  Var y = slice(transpose(x, 0, 1), 0, 1, 3);  // rows 1..2 of x^T = columns 1..2 of x
  backward(sum(mul(y, y)));
  CHECK(x.grad().to_vector() == std::vector<Scalar>{0, 4, 6, 0, 10, 12});
}

TEST_CASE("results are bitwise identical across thread counts for row kernels") {
  Rng rng(3);
  Tensor xt = Tensor::empty({64, 96});
  rng.fill_normal(xt, 0, 1);
  auto run = [&](int threads) {
    parallel::set_num_threads(threads);
    Var x(xt, true);
    Var y = softmax(layer_norm(x, Var(), Var()));
    backward(sum(mul(y, y)));
    return std::make_pair(y.value().to_vector(), x.grad().to_vector());
  };
  const auto one = run(1), two = run(2);
  parallel::set_num_threads(0);
  CHECK(one.first == two.first);
  CHECK(one.second == two.second);
}

TEST_CASE("dropout: keeps 1 - p of the elements scaled by 1 / (1 - p), the backward with the same mask, on any thread count") {
  const int64_t n = 1 << 17;
  const Tensor ones = Tensor::ones({n});
  const int threads_before = parallel::num_threads();
  const auto run = [&](int threads) {
    parallel::set_num_threads(threads);
    Rng rng(5);
    Var x(ones, true);
    const Var y = dropout(x, 0.3f, rng);
    backward(y, ones);
    return std::make_pair(y.value().to_vector(), x.grad().to_vector());
  };
  const auto [y, dx] = run(2);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Scalar v = y[static_cast<size_t>(i)];
    CHECK((v == 0.0f || v == 1.0f / 0.7f));
    kept += v != 0.0f ? 1 : 0;
  }
  CHECK(binomial_z(static_cast<double>(kept) / static_cast<double>(n), 0.7, static_cast<double>(n)) < kZ);
  CHECK(dx == y);                // dy/dx = m / (1 - p), regenerated in the backward
  CHECK(run(1).first == y);      // the mask does not depend on the threads
  parallel::set_num_threads(threads_before);
  Rng a(5), b(5);
  const Tensor first = dropout(Var(ones), 0.3f, a).value(), second = dropout(Var(ones), 0.3f, a).value();
  CHECK(first.to_vector() != second.to_vector());  // each call draws a new mask
  CHECK(dropout(Var(ones), 0.3f, b).value().to_vector() == first.to_vector());
}
