// favor_attention (core/kernels/favor.h): against the float64 formula with a
// log-sum-exp over (key, feature) pairs, values and gradients, also where the
// plain exponentials overflow float; the recurrent scan equals the parallel
// form; thread counts do not change a bit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/kernels/favor.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/rng.h"
#include "golden.h"
#include "tapeformer/layers/attention/linear.h"

using namespace tapeformer;

namespace {

Tensor random(const Shape& s, Rng& rng, float scale, float shift = 0) {
  Tensor t = Tensor::empty(s);
  rng.fill_normal(t, shift, scale);
  return t;
}

struct Reference {
  std::vector<double> y, da, db, dv;
};

// y_i = sum_{j<=i, r} P_ijr v_j with P_ijr = e^(a_ir + b_jr - L_i), L_i = logsumexp over (j <= i, r);
// gradients for the upstream g by their formulas (ops.h). One slice (BH = 1).
Reference reference(const Tensor& a, const Tensor& b, const Tensor& v, const Tensor& g) {
  const int64_t T = a.dim(2), R = a.dim(3), M = v.dim(3);
  const auto at = [](const Tensor& t, int64_t i, int64_t k) { return static_cast<double>(t.at({0, 0, i, k})); };
  Reference ref{std::vector<double>(T * M), std::vector<double>(T * R), std::vector<double>(T * R),
                std::vector<double>(T * M)};
  std::vector<double> L(T);
  for (int64_t i = 0; i < T; ++i) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j <= i; ++j)
      for (int64_t r = 0; r < R; ++r) mx = std::max(mx, at(a, i, r) + at(b, j, r));
    for (int64_t j = 0; j <= i; ++j)
      for (int64_t r = 0; r < R; ++r) sum += std::exp(at(a, i, r) + at(b, j, r) - mx);
    L[i] = mx + std::log(sum);
    for (int64_t j = 0; j <= i; ++j)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t m = 0; m < M; ++m) ref.y[i * M + m] += std::exp(at(a, i, r) + at(b, j, r) - L[i]) * at(v, j, m);
  }
  for (int64_t i = 0; i < T; ++i) {
    double gy = 0;
    for (int64_t m = 0; m < M; ++m) gy += at(g, i, m) * ref.y[i * M + m];
    for (int64_t j = 0; j <= i; ++j) {
      double gv = 0;
      for (int64_t m = 0; m < M; ++m) gv += at(g, i, m) * at(v, j, m);
      for (int64_t r = 0; r < R; ++r) {
        const double p = std::exp(at(a, i, r) + at(b, j, r) - L[i]);
        ref.da[i * R + r] += p * (gv - gy);
        ref.db[j * R + r] += p * (gv - gy);
        for (int64_t m = 0; m < M; ++m) ref.dv[j * M + m] += p * at(g, i, m);
      }
    }
  }
  return ref;
}

void check_vector(const Tensor& got, const std::vector<double>& want, const char* what, double tol) {
  const std::vector<Scalar> x = got.contiguous().to_vector();
  REQUIRE(x.size() == want.size());
  double worst = 0;
  for (size_t e = 0; e < x.size(); ++e)
    worst = std::max(worst, std::abs(x[e] - want[e]) / std::max(1.0, std::abs(want[e])));
  CHECK_MESSAGE(worst <= tol, what, ": worst relative error ", worst);
}

}  // namespace

TEST_CASE("favor_attention equals the float64 formula, values and gradients, where plain exponentials overflow") {
  // scale 1: moderate logs; scale 40 (shift 30): e^(a + b) would be e^(100+) in float.
  for (const auto& [scale, shift] : {std::pair<float, float>{1.0f, 0.0f}, {40.0f, 30.0f}}) {
    CAPTURE(scale);
    Rng rng(3);
    const int64_t T = 37, R = 6, M = 5;
    const Tensor a = random({1, 1, T, R}, rng, scale, shift), b = random({1, 1, T, R}, rng, scale, shift);
    const Tensor v = random({1, 1, T, M}, rng, 1.0f), g = random({1, 1, T, M}, rng, 1.0f);
    std::vector<Var> x{Var(a.clone(), true), Var(b.clone(), true), Var(v.clone(), true)};
    TapeScope tape;
    const Var y = favor_attention(x[0], x[1], x[2]);
    backward(y, g);
    const Reference ref = reference(a, b, v, g);
    // Logs near 100 carry float's relative error of ~1e-7 as ~1e-5 absolute in the exponents.
    const double tol = scale > 1 ? 1e-4 : 1e-5;
    check_vector(y.value(), ref.y, "y", tol);
    check_vector(x[0].grad(), ref.da, "da", 10 * tol);
    check_vector(x[1].grad(), ref.db, "db", 10 * tol);
    check_vector(x[2].grad(), ref.dv, "dv", tol);
  }
}

TEST_CASE("favor_scan token by token and in uneven pieces equals the parallel forward; threads change no bit") {
  Rng rng(9);
  const int64_t BH = 3, T = 50, R = 7, M = 4;
  const Tensor a = random({1, BH, T, R}, rng, 2.0f), b = random({1, BH, T, R}, rng, 2.0f), v = random({1, BH, T, M}, rng, 1.0f);
  const kernels::FavorShape s{BH, T, R, M};
  Tensor y = Tensor::empty({1, BH, T, M}), L = Tensor::empty({1, BH, T});
  kernels::favor_forward(a.data(), b.data(), v.data(), y.data(), L.data(), s);
  // The same through a state, in pieces of 1, 5 and the rest, slice by slice.
  std::vector<Scalar> S(BH * R * M, 0.0f), z(BH * R, 0.0f), c(BH * R, -INFINITY), piece_y;
  Tensor yr = Tensor::empty({1, BH, T, M});
  for (int64_t q = 0; q < BH; ++q)
    for (const auto& [t0, t1] : {std::pair<int64_t, int64_t>{0, 1}, {1, 6}, {6, T}}) {
      const int64_t n = t1 - t0;
      kernels::favor_scan(S.data() + q * R * M, z.data() + q * R, c.data() + q * R, a.data() + (q * T + t0) * R,
                          b.data() + (q * T + t0) * R, v.data() + (q * T + t0) * M, yr.data() + (q * T + t0) * M,
                          nullptr, kernels::FavorShape{1, n, R, M});
    }
  check_close(yr, y, "recurrent vs parallel", 1e-6);
  const int threads = parallel::num_threads();
  parallel::set_num_threads(1);
  Tensor y1 = Tensor::empty({1, BH, T, M}), L1 = Tensor::empty({1, BH, T});
  kernels::favor_forward(a.data(), b.data(), v.data(), y1.data(), L1.data(), s);
  parallel::set_num_threads(threads);
  CHECK(std::memcmp(y1.data(), y.data(), sizeof(Scalar) * BH * T * M) == 0);
}

TEST_CASE("FAVOR+: the random-feature estimate of e^(q . k / sqrt(D)) improves as features grow") {
  const int64_t D = 16;
  std::vector<double> errors;
  for (const int64_t m : {16, 64, 256, 1024, 4096}) {
    Rng draw(5), rng(21);  // the same 40 (q, k) pairs for every m
    const Tensor w = orthogonal_random_features(D, m, draw);  // (D, m)
    double err = 0;
    for (int pair = 0; pair < 40; ++pair) {
      std::vector<double> q(D), k(D);
      for (int64_t d = 0; d < D; ++d) q[d] = 0.5 * rng.normal(), k[d] = 0.5 * rng.normal();
      const double s = std::pow(static_cast<double>(D), -0.25);
      double qk = 0, qq = 0, kk = 0;
      for (int64_t d = 0; d < D; ++d) qk += q[d] * k[d], qq += q[d] * q[d] * s * s, kk += k[d] * k[d] * s * s;
      double estimate = 0;
      for (int64_t r = 0; r < m; ++r) {
        double wq = 0, wk = 0;
        for (int64_t d = 0; d < D; ++d) wq += w.at({d, r}) * q[d] * s, wk += w.at({d, r}) * k[d] * s;
        estimate += std::exp(wq - qq / 2) * std::exp(wk - kk / 2);
      }
      estimate /= static_cast<double>(m);
      const double exact = std::exp(qk / std::sqrt(static_cast<double>(D)));
      err += std::abs(estimate - exact) / exact;
    }
    errors.push_back(err / 40);
    MESSAGE("m = ", m, ": mean relative error ", errors.back());
  }
  for (size_t i = 1; i < errors.size(); ++i) CHECK(errors[i] < errors[i - 1]);
  CHECK(errors.back() < errors.front() / 8);  // ~ 1 / sqrt(m): 256x the features, about 16x smaller
}

TEST_CASE("FAVOR+: random features are redrawn every feature_redraw optimizer steps, the same from the same seed") {
  ModelConfig c;
  c.n_embd = 16;
  c.n_head = 2;
  c.attention = "linear";
  c.options["feature_map"] = std::string("favor");
  c.options["n_features"] = int64_t{12};
  c.options["feature_redraw"] = int64_t{3};
  Rng r1(4), r2(4);
  LinearAttention a(c, std::make_shared<PositionalLayer>(), r1), b(c, std::make_shared<PositionalLayer>(), r2);
  REQUIRE(a.omega.shape() == Shape{8, 12});
  const std::vector<Scalar> w0 = a.omega.to_vector();
  CHECK_FALSE(a.optimizer_stepped(1));  // reports no changed buffer, so replicas skip the copy
  CHECK_FALSE(a.optimizer_stepped(2));
  CHECK(a.omega.to_vector() == w0);  // not yet
  CHECK(a.optimizer_stepped(3));
  const std::vector<Scalar> w1 = a.omega.to_vector();
  CHECK(w1 != w0);
  b.optimizer_stepped(3);
  CHECK(b.omega.to_vector() == w1);  // the same draw from the same init stream
  // Columns of one block of D are orthogonal.
  double dot = 0;
  for (int64_t d = 0; d < 8; ++d) dot += a.omega.at({d, 0}) * a.omega.at({d, 1});
  CHECK(std::abs(dot) < 1e-4);
}
