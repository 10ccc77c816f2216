// Kernels against naive loops: the packet GEMM over every tile remainder, the
// Eigen fallback, bias and accumulation; the tiled transpose copy.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/activation.h"
#include "tapeformer/core/kernels/attention.h"
#include "tapeformer/core/kernels/matmul.h"
#include "tapeformer/core/kernels/norm.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/core/tensor.h"

using namespace tapeformer;

namespace {

Tensor random_tensor(const Shape& s, Rng& rng) {
  Tensor t = Tensor::empty(s);
  rng.fill_uniform(t, -1.0f, 1.0f);
  return t;
}

// The values of several tensors, one after the other (a run's outputs, compared bit for bit).
std::vector<Scalar> values_of(std::initializer_list<const Tensor*> tensors) {
  std::vector<Scalar> all;
  for (const Tensor* t : tensors) {
    const auto v = t->to_vector();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// C = A B (+ C0) (+ bias) in double, one element at a time.
std::vector<double> naive(const kernels::MatRef& a, const kernels::MatRef& b, const std::vector<Scalar>& c0,
                          const Scalar* bias) {
  std::vector<double> c(static_cast<size_t>(a.rows * b.cols));
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < b.cols; ++j) {
      double s = c0.empty() ? 0.0 : c0[static_cast<size_t>(i * b.cols + j)];
      if (bias) s += bias[j];
      for (int64_t k = 0; k < a.cols; ++k)
        s += static_cast<double>(a.data[i * a.row_stride + k * a.col_stride]) *
             b.data[k * b.row_stride + j * b.col_stride];
      c[static_cast<size_t>(i * b.cols + j)] = s;
    }
  return c;
}

}  // namespace

TEST_CASE("gemm equals the naive product for every tile remainder, layout, bias and accumulate") {
  Rng rng(7);
  // M covers 0..5 leftover rows of the 6-row tile; N covers 0..3 whole packets
  // past the 64-column blocks and a partial packet; K = 0 adds nothing.
  for (int64_t M : {1, 5, 6, 7, 13, 30}) {
    for (int64_t N : {1, 15, 16, 17, 48, 64, 65, 100, 130}) {
      for (int64_t K : {0, 1, 3, 37}) {
        for (int layout = 0; layout < 4; ++layout) {
          const bool a_t = layout & 1, b_t = layout & 2;  // transposed views of A and/or B
          Tensor a = random_tensor(a_t ? Shape{K, M} : Shape{M, K}, rng);
          Tensor b = random_tensor(b_t ? Shape{N, K} : Shape{K, N}, rng);
          Tensor bias = random_tensor({N}, rng);
          const kernels::MatRef am = a_t ? kernels::MatRef{a.data(), M, K, 1, M} : kernels::MatRef{a.data(), M, K, K, 1};
          const kernels::MatRef bm = b_t ? kernels::MatRef{b.data(), K, N, 1, K} : kernels::MatRef{b.data(), K, N, N, 1};
          for (int mode = 0; mode < 4; ++mode) {
            const bool accumulate = mode & 1, with_bias = mode & 2;
            CAPTURE(M);
            CAPTURE(N);
            CAPTURE(K);
            CAPTURE(layout);
            CAPTURE(mode);
            Tensor c = random_tensor({M, N}, rng);
            const std::vector<Scalar> c0 = accumulate ? c.to_vector() : std::vector<Scalar>();
            kernels::gemm(am, bm, c.data(), N, accumulate, with_bias ? bias.data() : nullptr);
            const std::vector<double> want = naive(am, bm, c0, with_bias ? bias.data() : nullptr);
            const std::vector<Scalar> got = c.to_vector();
            double worst = 0;
            for (size_t i = 0; i < want.size(); ++i) {
              const double d = std::abs(got[i] - want[i]);
              if (std::isnan(d) || d > worst) worst = d;  // a NaN stays the worst
            }
            CHECK(worst < 1e-5 * (K + 2));
          }
        }
      }
    }
  }
}

TEST_CASE("gemm epilogues equal the plain product followed by activate_rows or a multiply") {
  // Both paths of gemm (the packet kernel; Eigen's for a B with strided rows)
  // and tile remainders in rows and columns.
  Rng rng(11);
  for (int64_t M : {5, 13}) {
    for (int64_t N : {7, 16, 70}) {
      for (bool b_t : {false, true}) {
        const int64_t K = 9;
        CAPTURE(M);
        CAPTURE(N);
        CAPTURE(b_t);
        Tensor a = random_tensor({M, K}, rng), b = random_tensor(b_t ? Shape{N, K} : Shape{K, N}, rng);
        Tensor bias = random_tensor({N}, rng), factor = random_tensor({M, N}, rng);
        const kernels::MatRef am{a.data(), M, K, K, 1};
        const kernels::MatRef bm = b_t ? kernels::MatRef{b.data(), K, N, 1, K} : kernels::MatRef{b.data(), K, N, N, 1};
        Tensor plain = Tensor::empty({M, N});
        kernels::gemm(am, bm, plain.data(), N, false, bias.data());
        for (Activation act : {Activation::Gelu, Activation::Relu, Activation::Silu}) {
          Tensor want = plain.clone(), want_d = Tensor::empty({M, N});
          kernels::activate_rows(act, want.data(), want_d.data(), M * N);
          Tensor got = Tensor::empty({M, N}), got_d = Tensor::empty({M, N}), got_nod = Tensor::empty({M, N});
          kernels::gemm(am, bm, got.data(), N, false, bias.data(), kernels::Epilogue::activate(act, got_d.data()));
          kernels::gemm(am, bm, got_nod.data(), N, false, bias.data(), kernels::Epilogue::activate(act, nullptr));
          CHECK(got.to_vector() == want.to_vector());
          CHECK(got_d.to_vector() == want_d.to_vector());
          CHECK(got_nod.to_vector() == want.to_vector());
        }
        Tensor got = Tensor::empty({M, N});
        kernels::gemm(am, bm, got.data(), N, false, bias.data(), kernels::Epilogue::multiply(factor.data()));
        const auto g = got.to_vector(), p = plain.to_vector(), f = factor.to_vector();
        for (size_t i = 0; i < g.size(); ++i) REQUIRE(g[i] == p[i] * f[i]);
      }
    }
  }
  Tensor a = random_tensor({2, 2}, rng), c = Tensor::empty({2, 2});
  CHECK_THROWS_WITH(kernels::gemm({a.data(), 2, 2, 2, 1}, {a.data(), 2, 2, 2, 1}, c.data(), 2, true, nullptr,
                                  kernels::Epilogue::activate(Activation::Gelu, nullptr)),
                    doctest::Contains("accumulate"));
}

TEST_CASE("large products (blocked and packed) give the in-place kernel's bits and the naive product") {
  // Products of many rows with a transposed A, or an A larger than L2, run
  // blocked over K and packed; 12-row slices of the same product run in
  // place. Both sum each element over k in order, so they must agree bit for
  // bit, across K blocks (K > kc), A blocks (M > mc), partial column blocks
  // (N = 70, 130), bias, accumulate and epilogues.
  Rng rng(13);
  for (int64_t M : {130, 600}) {
    for (int64_t N : {70, 130}) {
      for (bool a_t : {true, false}) {
        const int64_t K = 1100;
        CAPTURE(M);
        CAPTURE(N);
        CAPTURE(a_t);
        Tensor a = random_tensor(a_t ? Shape{K, M} : Shape{M, K}, rng), b = random_tensor({K, N}, rng);
        Tensor bias = random_tensor({N}, rng), c0 = random_tensor({M, N}, rng), factor = random_tensor({M, N}, rng);
        const auto a_rows = [&](int64_t i0, int64_t rows) {
          return a_t ? kernels::MatRef{a.data() + i0, rows, K, 1, M} : kernels::MatRef{a.data() + i0 * K, rows, K, K, 1};
        };
        const kernels::MatRef bm{b.data(), K, N, N, 1};
        for (int mode = 0; mode < 5; ++mode) {  // plain, +bias, +=, gelu epilogue, multiply epilogue
          CAPTURE(mode);
          const bool accumulate = mode == 2, with_bias = mode == 1 || mode >= 3;
          Tensor aux = Tensor::zeros({M, N});
          const auto epilogue = [&](int64_t i0) {
            if (mode == 3) return kernels::Epilogue::activate(Activation::Gelu, aux.data() + i0 * N);
            if (mode == 4) return kernels::Epilogue::multiply(factor.data() + i0 * N);
            return kernels::Epilogue{};
          };
          Tensor whole = c0.clone(), sliced = c0.clone();
          kernels::gemm(a_rows(0, M), bm, whole.data(), N, accumulate, with_bias ? bias.data() : nullptr, epilogue(0));
          const std::vector<Scalar> whole_aux = aux.to_vector();
          for (int64_t i0 = 0; i0 < M; i0 += 12) {
            const int64_t rows = std::min<int64_t>(12, M - i0);
            kernels::gemm(a_rows(i0, rows), bm, sliced.data() + i0 * N, N, accumulate,
                          with_bias ? bias.data() : nullptr, epilogue(i0));
          }
          CHECK(whole.to_vector() == sliced.to_vector());
          if (mode == 3) CHECK(whole_aux == aux.to_vector());
          if (mode > 2) continue;
          const std::vector<double> want =
              naive(a_rows(0, M), bm, accumulate ? c0.to_vector() : std::vector<Scalar>(), with_bias ? bias.data() : nullptr);
          const std::vector<Scalar> got = whole.to_vector();
          double worst = 0;
          for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
          CHECK(worst < 1e-5 * K);
        }
      }
    }
  }
}

TEST_CASE("batched_matmul epilogues: aux offsets per batch and per row block, for 1 and 3 threads") {
  // batch 2, M = 64, K = 16: with 3 threads (batch < threads) rows split into 4 blocks, so aux is
  // offset by batch and by row block; N = 70 ends in a partial packet.
  Rng rng(12);
  const int64_t batch = 2, M = 64, K = 16, N = 70;
  Tensor a = random_tensor({batch, M, K}, rng), b = random_tensor({K, N}, rng), factor = random_tensor({batch, M, N}, rng);
  const Tensor be = b.unsqueeze(0).expand({batch, K, N});
  Tensor plain = Tensor::empty({batch, M, N});
  kernels::batched_matmul(a, be, plain);
  Tensor want = plain.clone(), want_d = Tensor::empty({batch, M, N});
  kernels::activate_rows(Activation::Gelu, want.data(), want_d.data(), batch * M * N);
  for (int threads : {1, 3}) {
    CAPTURE(threads);
    parallel::set_num_threads(threads);
    Tensor got = Tensor::empty({batch, M, N}), got_d = Tensor::empty({batch, M, N});
    kernels::batched_matmul(a, be, got, false, Tensor(), kernels::Epilogue::activate(Activation::Gelu, got_d.data()));
    CHECK(got.to_vector() == want.to_vector());
    CHECK(got_d.to_vector() == want_d.to_vector());
    kernels::batched_matmul(a, be, got, false, Tensor(), kernels::Epilogue::multiply(factor.data()));
    const auto g = got.to_vector(), p = plain.to_vector(), f = factor.to_vector();
    for (size_t i = 0; i < g.size(); ++i) REQUIRE(g[i] == p[i] * f[i]);
  }
  parallel::set_num_threads(0);  // back to the default
  // ldc > N: the epilogue writes aux with C's leading dimension and nothing past N.
  const int64_t ldc = 80;
  std::vector<Scalar> c(static_cast<size_t>(M * ldc), 42.0f), d(static_cast<size_t>(M * ldc), 42.0f);
  kernels::gemm({a.data(), M, K, K, 1}, {b.data(), K, N, N, 1}, c.data(), ldc, false, nullptr,
                kernels::Epilogue::activate(Activation::Gelu, d.data()));
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t at = static_cast<size_t>(i * ldc + j), flat = static_cast<size_t>(i * N + j);
      if (j < N) {
        REQUIRE(c[at] == want.data()[flat]);
        REQUIRE(d[at] == want_d.data()[flat]);
      } else {
        REQUIRE(c[at] == 42.0f);
        REQUIRE(d[at] == 42.0f);
      }
    }
  }
}

TEST_CASE("activate_rows: GELU (tanh form), ReLU and SiLU with their derivatives against double-precision formulas") {
  std::vector<Scalar> z;
  for (int i = -300; i <= 300; ++i) z.push_back(static_cast<Scalar>(i) / 50.0f);  // [-6, 6], 601: a partial packet
  for (Activation act : {Activation::Gelu, Activation::Relu, Activation::Silu}) {
    std::vector<Scalar> y = z, d(z.size());
    kernels::activate_rows(act, y.data(), d.data(), static_cast<int64_t>(z.size()));
    for (size_t i = 0; i < z.size(); ++i) {
      const double x = z[i], k = std::sqrt(2.0 / M_PI), c = 0.044715, t = std::tanh(k * (x + c * x * x * x));
      const double s = 1 / (1 + std::exp(-x));  // SiLU: y = x s, y' = s (1 + x (1 - s))
      const double want_y = act == Activation::Gelu ? 0.5 * x * (1 + t) : act == Activation::Silu ? x * s : std::max(x, 0.0);
      const double want_d = act == Activation::Gelu   ? 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x)
                            : act == Activation::Silu ? s * (1 + x * (1 - s))
                                                      : (x > 0 ? 1.0 : 0.0);
      CAPTURE(x);
      CHECK(y[i] == doctest::Approx(want_y).epsilon(1e-6).scale(1));
      // In float32, 1 - t^2 loses digits as t nears -1 or 1: allow 4 ulps of
      // t times the factor x k (1 + 3 c x^2) / 2 it is multiplied by. Past
      // |k (x + c x^3)| ~ 7.9 (|x| > 4.8) Eigen's tanh is exactly -1 or 1 and
      // the derivative 0 where the true one is at most 4e-6.
      const double rounding = 2.4e-7 * std::abs(0.5 * x * k * (1 + 3 * c * x * x));
      const double tol = act == Activation::Relu   ? 0.0
                         : act == Activation::Silu ? 1e-6 * (1 + std::abs(x))  // s and 1 - s to float rounding, times x
                         : std::abs(x) > 4.8       ? 4e-6
                                                   : 1e-6 * (1 + std::abs(want_d)) + rounding;
      CHECK(std::abs(d[i] - want_d) <= tol);
    }
  }
}

TEST_CASE("gemm leaves columns outside C's width alone (ldc > N)") {
  Rng rng(8);
  const int64_t M = 7, K = 5, N = 20, ldc = 33;
  Tensor a = random_tensor({M, K}, rng), b = random_tensor({K, N}, rng);
  std::vector<Scalar> c(static_cast<size_t>(M * ldc), 42.0f);
  kernels::gemm({a.data(), M, K, K, 1}, {b.data(), K, N, N, 1}, c.data(), ldc, false);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = N; j < ldc; ++j) CHECK(c[static_cast<size_t>(i * ldc + j)] == 42.0f);
}

TEST_CASE("batched_matmul with a transposed, broadcast B and a bias equals per-batch naive products") {
  Rng rng(9);
  const int64_t batch = 3, M = 11, K = 9, N = 70;
  Tensor a = random_tensor({batch, M, K}, rng);
  Tensor bt = random_tensor({N, K}, rng);
  Tensor b = bt.transpose(0, 1).unsqueeze(0).expand({batch, K, N});  // stride-0 batch, column-major
  Tensor bias = random_tensor({N}, rng);
  Tensor out = Tensor::empty({batch, M, N});
  kernels::batched_matmul(a, b, out, false, bias);
  for (int64_t bi = 0; bi < batch; ++bi) {
    const std::vector<double> want =
        naive({a.data() + bi * M * K, M, K, K, 1}, {bt.data(), K, N, 1, K}, {}, bias.data());
    for (int64_t i = 0; i < M * N; ++i) CHECK(out.data()[bi * M * N + i] == doctest::Approx(want[i]).epsilon(1e-5));
  }
}

TEST_CASE("contiguous() of transposed views equals element-wise indexing (tiled transpose)") {
  Rng rng(10);
  for (auto dims : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 17}, {16, 16}, {33, 65}, {128, 384}}) {
    Tensor x = random_tensor({2, dims.first, dims.second}, rng);
    Tensor t = x.transpose(1, 2).contiguous();  // [2, cols, rows]
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t i = 0; i < dims.second; ++i)
        for (int64_t j = 0; j < dims.first; ++j) REQUIRE(t.at({b, i, j}) == x.at({b, j, i}));
  }
}

TEST_CASE("batched_matmul and fused attention give the same bits for any thread count") {
  Rng rng(11);
  Tensor a = random_tensor({2, 50, 70}, rng), b = random_tensor({70, 90}, rng), bias = random_tensor({90}, rng);
  const Tensor be = b.unsqueeze(0).expand({2, 70, 90});
  const kernels::AttentionShape s{2, 37, 3, 12};
  Tensor qkv = random_tensor({2, 37, 108}, rng), dy = random_tensor({2, 37, 36}, rng);
  auto run = [&](int threads) {
    parallel::set_num_threads(threads);
    Tensor out = Tensor::empty({2, 50, 90});
    kernels::batched_matmul(a, be, out, false, bias);  // rows are split by thread count
    Tensor y = Tensor::empty({2, 37, 36}), probs = Tensor::empty({2, 3, 37, 37}), dqkv = Tensor::empty({2, 37, 108});
    kernels::causal_attention_forward(qkv.data(), y.data(), probs.data(), nullptr, s);
    kernels::causal_attention_backward(qkv.data(), probs.data(), nullptr, dy.data(), dqkv.data(), s);
    return values_of({&out, &y, &dqkv});
  };
  const auto one = run(1);
  CHECK(run(2) == one);
  CHECK(run(3) == one);
  parallel::set_num_threads(0);
}

TEST_CASE("layer_norm_backward_rows: parameter gradients over many row blocks equal naive sums, for any thread count") {
  Rng rng(12);
  const int64_t rows = 100, C = 24;  // 100 rows: three full blocks of partial sums and a short one
  Tensor x = random_tensor({rows, C}, rng), dy = random_tensor({rows, C}, rng), gamma = random_tensor({C}, rng);
  std::vector<Scalar> mean(rows), rstd(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += x.data()[r * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (x.data()[r * C + c] - m) * (x.data()[r * C + c] - m);
    mean[r] = static_cast<Scalar>(m);
    rstd[r] = static_cast<Scalar>(1.0 / std::sqrt(v / C + 1e-5));
  }
  std::vector<double> want_dg(C, 0.0), want_db(C, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (x.data()[r * C + c] - mean[r]) * double(rstd[r]);
      want_dg[c] += dy.data()[r * C + c] * xhat;
      want_db[c] += dy.data()[r * C + c];
    }
  std::vector<Scalar> first;
  for (int threads : {1, 2, 3}) {
    parallel::set_num_threads(threads);
    std::vector<Scalar> dx(rows * C), dg(C, 0.5f), db(C, -0.5f);  // accumulated into, not overwritten
    kernels::layer_norm_backward_rows(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(), dg.data(),
                                      db.data(), rows, C);
    for (int64_t c = 0; c < C; ++c) {
      CHECK(dg[c] == doctest::Approx(0.5 + want_dg[c]).epsilon(1e-5));
      CHECK(db[c] == doctest::Approx(-0.5 + want_db[c]).epsilon(1e-5));
    }
    std::vector<Scalar> all = dx;
    all.insert(all.end(), dg.begin(), dg.end());
    all.insert(all.end(), db.begin(), db.end());
    if (first.empty()) first = all;
    CHECK(all == first);
  }
  parallel::set_num_threads(0);
}

TEST_CASE("causal_attention_rows: any subset of rows equals the whole forward's rows bit for bit") {
  Rng rng(13);
  for (const int64_t T : {1, 5, 16, 17, 40, 64}) {
    for (const int64_t D : {4, 12, 32}) {
      CAPTURE(T);
      CAPTURE(D);
      const int64_t B = 2, H = 3, C = H * D;
      const kernels::AttentionShape s{B, T, H, D};
      Tensor qkv = random_tensor({B, T, 3 * C}, rng);
      Tensor y = Tensor::empty({B, T, C}), probs = Tensor::empty({B, H, T, T});
      kernels::causal_attention_forward(qkv.data(), y.data(), probs.data(), nullptr, s);
      // Every row, every other row, the last row of each sequence, one row.
      std::vector<std::vector<int64_t>> subsets(4);
      for (int64_t i = 0; i < B * T; ++i) {
        subsets[0].push_back(i);
        if (i % 2 == 1) subsets[1].push_back(i);
        if (i % T == T - 1) subsets[2].push_back(i);
      }
      subsets[3].push_back(B * T - 1 - T / 2);
      for (const auto& rows : subsets) {
        if (rows.empty()) continue;
        const auto R = static_cast<int64_t>(rows.size());
        Tensor got = Tensor::empty({R, C});
        kernels::causal_attention_rows(qkv.data(), rows.data(), R, got.data(), s);
        int64_t differ = 0;
        for (int64_t r = 0; r < R; ++r)
          for (int64_t c = 0; c < C; ++c) differ += got.data()[r * C + c] != y.data()[rows[r] * C + c];
        CHECK(differ == 0);
      }
    }
  }
  const kernels::AttentionShape s{1, 4, 1, 4};
  Tensor qkv = random_tensor({1, 4, 12}, rng), got = Tensor::empty({2, 4});
  const std::vector<int64_t> backwards = {2, 1}, outside = {4};
  CHECK_THROWS_WITH_AS(kernels::causal_attention_rows(qkv.data(), backwards.data(), 2, got.data(), s),
                       doctest::Contains("out of range or out of order"), Error);
  CHECK_THROWS_WITH_AS(kernels::causal_attention_rows(qkv.data(), outside.data(), 1, got.data(), s),
                       doctest::Contains("row 4 of 4"), Error);
}

TEST_CASE("batched_matmul: a few rows split into column blocks give the same bits for any thread count") {
  // 1 and 4 rows (a token at a time, a subset of positions): the threads take
  // column blocks, bias and the epilogue's second output included.
  Rng rng(14);
  for (const int64_t M : {1, 4}) {
    CAPTURE(M);
    const int64_t K = 512, N = 1000;  // N: whole 64-column blocks and a partial one
    Tensor a = random_tensor({1, M, K}, rng), b = random_tensor({1, K, N}, rng), bias = random_tensor({N}, rng);
    auto run = [&](int threads) {
      parallel::set_num_threads(threads);
      Tensor plain = Tensor::empty({1, M, N}), act = Tensor::empty({1, M, N}), dydx = Tensor::empty({1, M, N});
      kernels::batched_matmul(a, b, plain, false, bias);
      kernels::batched_matmul(a, b, act, false, bias, kernels::Epilogue::activate(Activation::Gelu, dydx.data()));
      return values_of({&plain, &act, &dydx});
    };
    const auto one = run(1);
    CHECK(run(2) == one);
    CHECK(run(3) == one);
    CHECK(run(8) == one);
    // A row's bits do not depend on the rows beside it (what computing some positions alone relies on).
    Tensor tall = random_tensor({1, 100, K}, rng);
    std::copy_n(a.data(), M * K, tall.data() + 37 * K);  // a's rows at rows 37..
    Tensor out_tall = Tensor::empty({1, 100, N});
    kernels::batched_matmul(tall, b, out_tall, false, bias);
    int64_t differ = 0;
    for (int64_t i = 0; i < M * N; ++i) differ += out_tall.data()[37 * N + i] != one[static_cast<size_t>(i)];
    CHECK(differ == 0);
    // And the products themselves: row 0, column 999 summed in order.
    double want = bias.data()[N - 1];
    for (int64_t k = 0; k < K; ++k) want += static_cast<double>(a.data()[k]) * b.data()[k * N + N - 1];
    CHECK(std::abs(one[static_cast<size_t>(N - 1)] - want) < 1e-3);
  }
  parallel::set_num_threads(0);
}
