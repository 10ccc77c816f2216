// The canonical order of tapeformer's vector code, written out in plain
// scalar C++ (16 lanes, the fold tree, std::fma for every fused
// multiply-add) and compared bit for bit with the packet code of this build,
// whatever its registers (16 floats with AVX-512, two 8-float halves with
// AVX2): a build whose bits would differ from another CPU's fails here.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/kernels/vector_loops.h"
#include "tapeformer/core/rng.h"

using namespace tapeformer;
namespace vec = tapeformer::kernels::vec;

namespace {

constexpr int kLanes = 16;

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Lanes i and i + 8, then i and i + 4, i and i + 2, the last two.
float fold(std::vector<float> lane) {
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) lane[i] = lane[i] + lane[i + w];
  return lane[0];
}

// Lane i accumulates entries i, i + 16, ... (a partial last packet adds 0 to its empty lanes).
float sum_spec(const float* x, int64_t n) {
  std::vector<float> lane(kLanes, 0.0f);
  for (int64_t i = 0; i < n; ++i) lane[i % kLanes] = x[i] + lane[i % kLanes];
  for (int64_t i = n; i % kLanes != 0; ++i) lane[i % kLanes] = 0.0f + lane[i % kLanes];
  return fold(lane);
}
float dot_spec(const float* x, const float* y, int64_t n) {
  std::vector<float> lane(kLanes, 0.0f);
  for (int64_t i = 0; i < n; ++i) lane[i % kLanes] = std::fma(x[i], y[i], lane[i % kLanes]);
  for (int64_t i = n; i % kLanes != 0; ++i) lane[i % kLanes] = std::fma(0.0f, 0.0f, lane[i % kLanes]);
  return fold(lane);
}

// Four accumulators: packet j of every 64 entries (and of the remainder) into accumulator j.
float sum_squares_spec(const float* x, int64_t n) {
  std::vector<std::vector<float>> acc(4, std::vector<float>(kLanes, 0.0f));
  const int64_t padded = (n + kLanes - 1) / kLanes * kLanes;
  for (int64_t i = 0; i < padded; ++i) {
    const float v = i < n ? x[i] : 0.0f;
    float& lane = acc[(i / kLanes) % 4][i % kLanes];
    lane = std::fma(v, v, lane);
  }
  std::vector<float> lane(kLanes);
  for (int l = 0; l < kLanes; ++l) lane[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
  return fold(lane);
}

// e^x: Cephes' polynomial on r = x - m ln 2, m = floor(x log2 e + 1/2), times 2^m in the exponent bits.
float exp_spec(float x_in) {
  const float x = std::fmax(std::fmin(x_in, 88.3762626647950f), -88.3762626647949f);
  const float m = std::floor(std::fma(x, 1.44269504088896341f, 0.5f));
  const float r = std::fma(m, -0.6931471805599453f, x);
  const float r2 = r * r, r3 = r2 * r;
  float y = std::fma(1.9875691500E-4f, r, 1.3981999507E-3f);
  float y1 = std::fma(4.1665795894E-2f, r, 1.6666665459E-1f);
  const float y2 = r + 1.0f;
  y = std::fma(y, r, 8.3334519073E-3f);
  y1 = std::fma(y1, r, 5.0000001201E-1f);
  y = std::fma(y, r3, y1);
  y = std::fma(y, r2, y2);
  const uint32_t e = static_cast<uint32_t>(static_cast<int32_t>(m + 127.0f)) << 23;
  float two_m;
  std::memcpy(&two_m, &e, sizeof two_m);
  const float out = y * two_m;
  return x_in > out ? x_in : out;  // pmax(y 2^m, x): inf stays inf, NaN propagates
}

}  // namespace

TEST_CASE("vec sums and dot products: 16 lanes and one fold tree on every instruction set") {
  Rng rng(5);
  std::vector<float> buf(300), other(300);
  for (float& v : buf) v = rng.normal() * 3.0f;
  for (float& v : other) v = rng.normal();
  int compared = 0;
  for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 65, 100, 255}) {
    for (int64_t offset : {0, 1, 3, 8, 13}) {  // any alignment
      const float* x = buf.data() + offset;
      const float* y = other.data() + offset;
      CAPTURE(n);
      CAPTURE(offset);
      CHECK(bits(vec::sum(x, n)) == bits(sum_spec(x, n)));
      CHECK(bits(vec::dot(x, y, n)) == bits(dot_spec(x, y, n)));
      CHECK(bits(vec::sum_squares(x, n)) == bits(sum_squares_spec(x, n)));
      ++compared;
    }
  }
  CHECK(compared == 75);
  // The order matters: a sequential sum of the same entries differs somewhere, so the checks above can fail.
  bool some_differ = false;
  for (int64_t n = 17; n < 200 && !some_differ; ++n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s += buf[i];
    some_differ = bits(s) != bits(sum_spec(buf.data(), n));
  }
  CHECK(some_differ);
}

TEST_CASE("eigen::exp: the same polynomial and multiply-adds in every lane, a row's last packet included") {
  std::vector<float> x;
  for (float v = -100.0f; v <= 100.0f; v += 0.37f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.3f, 88.5f, -87.9f, -88.4f, 1.0f, -1.0f}) x.push_back(v);
  x.push_back(INFINITY);
  x.push_back(-INFINITY);
  std::vector<float> y(x.size());
  vec::map(x.data(), y.data(), static_cast<int64_t>(x.size()), [](const eigen::Packet& p) { return eigen::exp(p); });
  int64_t same = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    CAPTURE(x[i]);
    CHECK(bits(y[i]) == bits(exp_spec(x[i])));
    same += bits(y[i]) == bits(exp_spec(x[i]));
    CHECK(bits(vec::exp_scalar(x[i])) == bits(y[i]));  // the one-lane form for per-row scalars
  }
  CHECK(same == static_cast<int64_t>(x.size()));
  // ... and it is e^x: within a few float steps of libm's, 0 below -88.38, inf above 88.38.
  for (float v : {-20.0f, -1.0f, 0.5f, 3.0f, 40.0f}) CHECK(exp_spec(v) == doctest::Approx(std::exp(v)).epsilon(1e-6));
  CHECK(exp_spec(-90.0f) == 0.0f);
  CHECK(std::isinf(exp_spec(90.0f)));
}

TEST_CASE("vec::max and sum_exp skip the lanes past a row's end") {
  std::vector<float> x(40, -5.0f);  // all negative: a 0 in an empty lane would win the max
  x[3] = -2.0f;
  for (int64_t n : {1, 4, 17, 33}) {
    CAPTURE(n);
    CHECK(vec::max(x.data(), n) == (n > 3 ? -2.0f : -5.0f));
    std::vector<float> shifted(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) shifted[i] = x[i] - 1.0f;
    std::vector<float> e(static_cast<size_t>(n));
    vec::map(shifted.data(), e.data(), n, [](const eigen::Packet& p) { return eigen::exp(p); });
    CHECK(bits(vec::sum_exp(x.data(), 1.0f, n)) == bits(sum_spec(e.data(), n)));
  }
}

TEST_CASE("eigen::max_of picks the lane the scalar fold picks, NaN and signed zeros included") {
  Rng rng(7);
  const float specials[] = {0.0f, -0.0f, std::nanf(""), -1.0f, 1.0f, -std::numeric_limits<float>::infinity()};
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<float> lane(kLanes);
    for (float& v : lane) v = rng.below(2) == 0 ? specials[rng.below(6)] : rng.normal();
    std::vector<float> tree = lane;  // op(a, b) = a < b ? b : a, the fold of sum's tree
    for (int w = kLanes / 2; w >= 1; w /= 2)
      for (int i = 0; i < w; ++i) tree[i] = tree[i] < tree[i + w] ? tree[i + w] : tree[i];
    CAPTURE(trial);
    CHECK(bits(eigen::max_of(Eigen::internal::ploadu<eigen::Packet>(lane.data()))) == bits(tree[0]));
  }
}
