#include "tapeformer/core/rng.h"

#include "tapeformer/core/parallel.h"

#include <cmath>

#include "tapeformer/core/error.h"

namespace tapeformer {
namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

void Rng::seed_with(uint64_t seed) {
  for (auto& w : s_) w = splitmix64(seed);
  has_spare_ = false;
  spare_ = 0.0f;
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

float Rng::uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }

uint64_t Rng::below(uint64_t n) {
  TAPEFORMER_CHECK(n >= 1, "Rng::below: n must be >= 1");
  // Rejection sampling removes modulo bias.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = next_u64(); while (x >= limit);
  return x % n;
}

float Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // Box-Muller in double; u1 in (0, 1] so log is finite.
  const double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = static_cast<float>(r * std::sin(2.0 * M_PI * u2));
  has_spare_ = true;
  return static_cast<float>(r * std::cos(2.0 * M_PI * u2));
}

template <class F>
void Rng::fill_each(Tensor& t, F&& f) {
  TAPEFORMER_CHECK(t.defined(), "Rng: cannot fill an undefined tensor");
  if (t.is_contiguous()) {
    Scalar* p = t.data();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = f();
  } else {
    Tensor tmp = Tensor::empty(t.shape());
    fill_each(tmp, f);
    t.copy_from(tmp);
  }
}

void Rng::fill_uniform(Tensor& t, float lo, float hi) {
  TAPEFORMER_CHECK(lo <= hi, "Rng::fill_uniform: lo ", lo, " > hi ", hi);
  fill_each(t, [&] { return lo + (hi - lo) * uniform(); });
}

void Rng::fill_normal(Tensor& t, float mean, float std) {
  TAPEFORMER_CHECK(std >= 0, "Rng::fill_normal: negative std ", std);
  fill_each(t, [&] { return mean + std * normal(); });
}

void Rng::fill_bernoulli(Tensor& t, float p) {
  TAPEFORMER_CHECK(p >= 0 && p <= 1, "Rng::fill_bernoulli: p = ", p, " is not in [0, 1]");
  fill_each(t, [&] { return uniform() < p ? 1.0f : 0.0f; });
}

void Rng::fill_dropout_mask(Tensor& t, float p) {
  TAPEFORMER_CHECK(p >= 0 && p < 1, "Rng::fill_dropout_mask: p = ", p, " is not in [0, 1)");
  TAPEFORMER_CHECK(t.defined() && t.is_contiguous(), "Rng::fill_dropout_mask: the mask must be a contiguous tensor");
  TAPEFORMER_CHECK(t.numel() < (int64_t{1} << 32), "Rng::fill_dropout_mask: ", t.numel(),
                   " elements, more than a mask's 2^32 - 1");
  const DropoutMask mask(next_u64(), p);
  Scalar* out = t.data();
  parallel::parallel_for(t.numel(), 1 << 14, [&](int64_t i0, int64_t i1) {
    for (auto i = static_cast<uint32_t>(i0); i < static_cast<uint32_t>(i1); ++i)
      out[i] = mask.keeps(i) ? mask.scale : 0.0f;
  });
}

}  // namespace tapeformer
