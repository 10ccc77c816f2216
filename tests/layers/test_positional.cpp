// Positional schemes: RoPE's scores depend on i - j only, ALiBi's slopes and
// biases follow the published rule, Shaw's gather / scatter-add equal naive
// loops, the sinusoidal table is Vaswani's.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "golden.h"
#include "tapeformer/layers/positional/positional.h"

using namespace tapeformer;

namespace {

Tensor random(Shape s, uint64_t seed) {
  Tensor t = Tensor::empty(s);
  Rng rng(seed);
  rng.fill_normal(t, 0.0f, 1.0f);
  return t;
}

double dot(const Tensor& a, int64_t i, const Tensor& b, int64_t j, int64_t D) {
  double s = 0;
  for (int64_t d = 0; d < D; ++d) s += static_cast<double>(a.data()[i * D + d]) * b.data()[j * D + d];
  return s;
}

}  // namespace

TEST_CASE("RoPE: rotated scores depend only on the offset i - j") {
  // The same query and key vectors placed at every position: q_i . k_j after
  // rotation must be a function of i - j.
  const int64_t T = 40, D = 16;
  const Tensor q1 = random({1, D}, 1), k1 = random({1, D}, 2);
  const Tensor q = q1.expand({T, D}).contiguous(), k = k1.expand({T, D}).contiguous();  // (T, D)
  for (int64_t start : {0, 1000}) {  // far positions too: angles are computed in double
    CAPTURE(start);
    const Tensor qr = rotary(Var(q.reshape({1, 1, T, D})), 2, start).value().reshape({T, D});
    const Tensor kr = rotary(Var(k.reshape({1, 1, T, D})), 2, start).value().reshape({T, D});
    for (int64_t off = -5; off <= 5; ++off) {
      const double ref = dot(qr, 10, kr, 10 - off, D);
      for (int64_t i = std::max<int64_t>(0, off); i < T && i - off < T; ++i)
        CHECK(dot(qr, i, kr, i - off, D) == doctest::Approx(ref).epsilon(1e-5));
    }
    // ... and on more than the offset: without rotation the score is constant,
    // with it offsets differ (the check above is not trivially true).
    CHECK(std::abs(dot(qr, 10, kr, 10, D) - dot(qr, 10, kr, 5, D)) > 1e-3);
  }
  // Pair (2k, 2k+1) at position p turns by p * 10000^(-2k/D): position 1, pair 1.
  Tensor x = Tensor::zeros({1, 2, D});
  x.at({0, 1, 2}) = 1.0f;  // position 1, component 2 (pair k = 1)
  const Tensor y = rotary(Var(x), 1, 0).value();
  const double angle = std::pow(10000.0, -2.0 / D);
  CHECK(y.at({0, 1, 2}) == doctest::Approx(std::cos(angle)).epsilon(1e-6));
  CHECK(y.at({0, 1, 3}) == doctest::Approx(std::sin(angle)).epsilon(1e-6));
  CHECK(y.at({0, 0, 0}) == 0.0f);
  CHECK_THROWS_WITH_AS(rotary(Var(x), 2, 0), "rotary: position axis 2 must be one of the first 2 axes of x [1, 2, 16] "
                                             "(the last holds the features)", Error);
  CHECK_THROWS_WITH_AS(rotary(Var(x), 1, -1), "rotary: start position must be >= 0, got -1", Error);
}

TEST_CASE("ALiBi slopes: 8 heads 1/2 ... 1/256, 6 heads by the non-power-of-two rule") {
  // Press et al.'s get_slopes: 2^(-8h/n) for n a power of two; otherwise the
  // 4-head slopes (1/4, 1/16, 1/64, 1/256) then every other 8-head slope (1/2, 1/8).
  CHECK(alibi_slopes(8) == std::vector<float>{0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f, 0.0078125f, 0.00390625f});
  CHECK(alibi_slopes(6) == std::vector<float>{0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f});
  CHECK(alibi_slopes(1) == std::vector<float>{0.00390625f});
  const std::vector<float> s12 = alibi_slopes(12);  // 8 slopes, then 16-head slopes 0, 2, 4, 6
  REQUIRE(s12.size() == 12);
  CHECK(s12[8] == doctest::Approx(std::exp2(-0.5)));
  CHECK(s12[11] == doctest::Approx(std::exp2(-3.5)));
  CHECK_THROWS_WITH_AS(alibi_slopes(0), "alibi_slopes: n_head must be >= 1, got 0", Error);
}

TEST_CASE("ALiBi's bias terms add up to -m_h (i - j) up to a per-row constant, at any absolute position") {
  ModelConfig c;
  c.n_head = 8;
  c.positional = "alibi";
  Rng rng(0);
  const auto layer = positional_kinds().get("alibi").make(c, rng)->make_layer(rng);
  CHECK(layer->needs().score_bias);
  const std::vector<float> m = alibi_slopes(8);
  for (const auto& [q0, k0] : {std::pair<int64_t, int64_t>{0, 0}, {5000, 4990}}) {
    const int64_t Tq = 3, Tk = 13;
    const std::vector<Tensor> terms = layer->score_bias(8, Tq, Tk, q0, k0);
    REQUIRE(terms.size() == 2);
    CHECK(terms[0].shape() == Shape{1, 8, Tq, 1});
    CHECK(terms[1].shape() == Shape{1, 8, 1, Tk});
    for (int64_t h = 0; h < 8; ++h)
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < Tk; ++j) {
          const double bias = terms[0].at({0, h, i, 0}) + terms[1].at({0, h, 0, j});
          const double want = -m[h] * static_cast<double>((q0 + i) - (k0 + j));
          CHECK(bias == want);  // exact: slopes are powers of two, positions integers
        }
  }
}

TEST_CASE("Shaw: relative_gather and relative_scatter equal naive loops (clipping, offsets, windows)") {
  const int64_t K = 2, W = 2 * K + 1, Tq = 4, Tk = 9;
  for (const auto& [q0, k0] : {std::pair<int64_t, int64_t>{0, 0}, {5, 0}, {12, 7}}) {
    CAPTURE(q0);
    CAPTURE(k0);
    const Tensor r = random({2, 3, Tq, W}, 3), p = random({2, 3, Tq, Tk}, 4);
    const Tensor g = relative_gather(Var(r), Tk, q0, k0).value(), s = relative_scatter(Var(p), K, q0, k0).value();
    REQUIRE(g.shape() == Shape{2, 3, Tq, Tk});
    REQUIRE(s.shape() == Shape{2, 3, Tq, W});
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t i = 0; i < Tq; ++i) {
          std::vector<double> bins(W, 0.0);
          for (int64_t j = 0; j < Tk; ++j) {
            int64_t o = (k0 + j) - (q0 + i);
            o = o < -K ? -K : (o > K ? K : o);
            CHECK(g.at({b, h, i, j}) == r.at({b, h, i, o + K}));
            bins[o + K] += p.at({b, h, i, j});
          }
          for (int64_t c = 0; c < W; ++c) CHECK(s.at({b, h, i, c}) == doctest::Approx(bins[c]).epsilon(1e-6));
        }
  }
  CHECK_THROWS_WITH_AS(relative_gather(Var(Tensor::zeros({3, 4})), 5, 0, 0),
                       "relative_gather: r [3, 4] must hold 2K + 1 offset columns (an odd count)", Error);
  CHECK_THROWS_WITH_AS(relative_scatter(Var(Tensor::zeros({3, 4})), -1, 0, 0),
                       "relative_scatter: clip distance K must be >= 0, got -1", Error);
}

TEST_CASE("sinusoidal positions: Vaswani's table at the token embeddings' scale, for any position") {
  ModelConfig c;
  c.positional = "sinusoidal";
  c.n_embd = 6;
  Rng rng(0);
  const auto pos = positional_kinds().get("sinusoidal").make(c, rng);
  CHECK(pos->max_positions() == -1);
  const Tensor x = Tensor::zeros({1, 3, 6});
  const Tensor y = pos->embed(Var(x), 100000).value();  // positions 100000..100002
  const double a = 0.02 * std::sqrt(2.0);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t k = 0; k < 3; ++k) {
      const double angle = static_cast<double>(100000 + t) / std::pow(10000.0, 2.0 * k / 6);
      CHECK(y.at({0, t, 2 * k}) == doctest::Approx(a * std::sin(angle)).epsilon(1e-5));
      CHECK(y.at({0, t, 2 * k + 1}) == doctest::Approx(a * std::cos(angle)).epsilon(1e-5));
    }
}
