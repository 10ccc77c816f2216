// bf16 products (core/kernels/precision.h): the rounding, the portable path
// against a sum written here, and the AVX512-BF16 kernel against the
// portable path bit for bit, on every layout gemm takes. The portable checks
// run on every machine; the fast ones where the CPU has the instructions.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/matmul.h"
#include "tapeformer/core/kernels/precision.h"
#include "tapeformer/core/rng.h"

using namespace tapeformer;
using namespace tapeformer::kernels;

namespace {

uint32_t bits(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
float from_bits(uint32_t u) {
  float x = 0;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// An operand of rows x cols with values of both signs and a wide range of
// magnitudes, stored with the given strides (unused cells NaN, so a read of
// one shows).
struct Operand {
  std::vector<float> data;
  MatRef ref{};
  Operand(int64_t rows, int64_t cols, bool transposed, Rng& rng, int64_t pad = 3) {
    const int64_t ld = (transposed ? rows : cols) + pad;
    data.assign(static_cast<size_t>(ld * (transposed ? cols : rows)), std::numeric_limits<float>::quiet_NaN());
    ref = transposed ? MatRef{data.data(), rows, cols, 1, ld} : MatRef{data.data(), rows, cols, ld, 1};
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t k = 0; k < cols; ++k)
        data[static_cast<size_t>(i * ref.row_stride + k * ref.col_stride)] =
            static_cast<float>((rng.uniform() - 0.5) * std::exp2(8 * rng.uniform() - 4));
  }
  float at(int64_t i, int64_t k) const { return ref.data[i * ref.row_stride + k * ref.col_stride]; }
};

// C = A B (+ bias) (+ C) under precision p.
std::vector<float> product(Precision p, const Operand& a, const Operand& b, const std::vector<float>& c0,
                           const float* bias, bool accumulate) {
  std::vector<float> c = c0;
  const ProductPrecision scope(p);
  gemm(a.ref, b.ref, c.data(), b.ref.cols, accumulate, bias);
  return c;
}

// The portable path's sum written out: bf16 operands, per element the pairs
// in order, an FMA of the odd product and then of the even one.
std::vector<float> written_out(const Operand& a, const Operand& b, const std::vector<float>& c0, const float* bias,
                               bool accumulate) {
  const int64_t M = a.ref.rows, N = b.ref.cols, K = a.ref.cols;
  std::vector<float> c(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const float init = bias ? bias[j] : 0.0f;
      float acc = accumulate ? init + c0[static_cast<size_t>(i * N + j)] : init;
      for (int64_t k = 0; k < K; k += 2) {
        if (k + 1 < K) acc = std::fma(round_bf16(a.at(i, k + 1)), round_bf16(b.at(k + 1, j)), acc);
        acc = std::fma(round_bf16(a.at(i, k)), round_bf16(b.at(k, j)), acc);
      }
      c[static_cast<size_t>(i * N + j)] = acc;
    }
  return c;
}

}  // namespace

TEST_CASE("to_bf16: round to nearest even, NaN kept, denormals flushed, overflow to infinity") {
  CHECK(to_bf16(1.0f) == 0x3f80);
  CHECK(to_bf16(from_bits(0x3f808000)) == 0x3f80);  // a tie: to the even 0x3f80
  CHECK(to_bf16(from_bits(0x3f818000)) == 0x3f82);  // a tie: to the even 0x3f82
  CHECK(to_bf16(from_bits(0x3f808001)) == 0x3f81);  // above the tie
  CHECK(to_bf16(-2.0f) == 0xc000);
  CHECK(to_bf16(from_bits(0x00400000)) == 0x0000);  // a denormal: +0
  CHECK(to_bf16(from_bits(0x80400000)) == 0x8000);  // -0
  CHECK(to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds up to infinity
  CHECK(to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  const uint16_t nan = to_bf16(from_bits(0x7f800001));  // a signalling NaN whose payload is in the low bits
  CHECK(((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0));
  CHECK(round_bf16(3.14159265f) == 3.140625f);
  CHECK(from_bf16(0x0001) == 0.0f);  // a denormal bf16 reads as zero
}

TEST_CASE("bf16 portable product: the pairs' sum written out, on every layout; far from the float32 product") {
  Rng rng(11);
  for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 5, 3}, {13, 70, 33}, {40, 17, 190}}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        const Operand a(M, K, ta, rng), b(K, N, tb, rng);
        std::vector<float> c0(static_cast<size_t>(M * N)), bias(static_cast<size_t>(N));
        for (float& x : c0) x = static_cast<float>(rng.uniform() - 0.5);
        for (float& x : bias) x = static_cast<float>(rng.uniform() - 0.5);
        for (const bool acc : {false, true}) {
          const std::vector<float> got = product(Precision::bf16_portable, a, b, c0, bias.data(), acc);
          const std::vector<float> want = written_out(a, b, c0, bias.data(), acc);
          CHECK(got == want);
        }
        // The float32 product differs by far more than the sum's order could
        // make it: an operand left in float32 would show.
        const std::vector<float> f32 = product(Precision::fp32, a, b, c0, nullptr, false);
        const std::vector<float> b16 = product(Precision::bf16_portable, a, b, c0, nullptr, false);
        double worst = 0;
        for (size_t i = 0; i < f32.size(); ++i) worst = std::max(worst, std::abs(double(f32[i]) - b16[i]));
        if (K >= 3) CHECK(worst > 1e-4);
      }
    }
  }
}

TEST_CASE("bf16 product on AVX512-BF16: the portable path's bits, on every layout and blocking") {
  if (!bf16_unsupported().empty()) {
    MESSAGE("skipped: " << bf16_unsupported());
    CHECK_THROWS_WITH_AS(ProductPrecision(Precision::bf16), doctest::Contains("train in \"fp32\""), Error);
    return;
  }
  Rng rng(12);
  // Tiles of 1 to 6 rows, 1 to 4 registers and a partial one; K odd and even,
  // and K over 2 blocks of pairs; more rows than an A block.
  for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 1}, {5, 3, 2}, {6, 16, 7}, {13, 70, 33}, {40, 130, 401}, {3000, 65, 20}, {64, 64, 64}}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        const Operand a(M, K, ta, rng), b(K, N, tb, rng);
        std::vector<float> c0(static_cast<size_t>(M * N)), bias(static_cast<size_t>(N));
        for (float& x : c0) x = static_cast<float>(rng.uniform() - 0.5);
        for (float& x : bias) x = static_cast<float>(rng.uniform() - 0.5);
        for (const bool acc : {false, true}) {
          const std::vector<float> fast = product(Precision::bf16, a, b, c0, acc ? nullptr : bias.data(), acc);
          const std::vector<float> portable = product(Precision::bf16_portable, a, b, c0, acc ? nullptr : bias.data(), acc);
          CHECK_MESSAGE(fast == portable, "M " << M << " N " << N << " K " << K << " ta " << ta << " tb " << tb);
        }
      }
    }
  }
  // Every float's rounding (through a product with 1): the instruction's
  // conversion and to_bf16 agree, NaNs, denormals and infinities included.
  std::vector<float> x(1 << 16);
  for (size_t i = 0; i < x.size(); ++i) x[i] = from_bits(static_cast<uint32_t>(rng.below(uint64_t{1} << 32)));
  for (uint32_t special : {0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x7f800000u, 0xff800001u, 0x3f808000u})
    x.push_back(from_bits(special));
  const float one = 1.0f;
  const auto times_one = [&](Precision p) {
    std::vector<float> c(x.size());
    const ProductPrecision scope(p);
    gemm({x.data(), static_cast<int64_t>(x.size()), 1, 1, 1}, {&one, 1, 1, 1, 1}, c.data(), 1, false);
    return c;
  };
  const std::vector<float> fast = times_one(Precision::bf16), portable = times_one(Precision::bf16_portable);
  for (size_t i = 0; i < x.size(); ++i) {
    const bool nan = std::isnan(fast[i]) && std::isnan(portable[i]);
    // The sum starts at +0, so x's rounding to -0 comes out +0: values, not bits, against round_bf16.
    CHECK_MESSAGE(((bits(fast[i]) == bits(portable[i]) && fast[i] == round_bf16(x[i])) || nan),
                  "x = " << bits(x[i]));
  }
}
