// Rng: the one seeded random generator, passed explicitly to everything random
// (init, dropout, data sampling) so runs reproduce bit for bit.
//
//   Rng rng(1234);
//   rng.fill_normal(w, 0.0f, 0.02f);
//   float u = rng.uniform();
//
// The algorithm is xoshiro256** seeded through splitmix64, with our own
// Box-Muller normals, so the stream is identical on every platform and
// standard library (std::normal_distribution is implementation-defined).
// The state is four words plus a cached normal; `save`/`load` work with cereal.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "tapeformer/core/error.h"
#include "tapeformer/core/tensor.h"

namespace tapeformer {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { seed_with(seed); }
  void seed_with(uint64_t seed);

  uint64_t next_u64();
  // Uniform in [0, 1) with 24 random bits.
  float uniform();
  // Uniform integer in [0, n); n >= 1.
  uint64_t below(uint64_t n);
  // Standard normal.
  float normal();

  void fill_uniform(Tensor& t, float lo, float hi);
  void fill_normal(Tensor& t, float mean, float std);
  // 1 with probability p, else 0.
  void fill_bernoulli(Tensor& t, float p);
  // Inverted-dropout mask: 1 / (1 - p) with probability 1 - p, else 0, element i
  // from DropoutMask(next_u64(), p).keeps(i) (below): the dropout op's mask.
  void fill_dropout_mask(Tensor& t, float p);

  bool operator==(const Rng& o) const {
    return s_ == o.s_ && has_spare_ == o.has_spare_ && spare_ == o.spare_;
  }

  // cereal: the four words, the cached-normal flag as one byte (0 or 1,
  // checked on load: any other byte in a bool is undefined behaviour), the cache.
  template <class Archive>
  void save(Archive& ar) const {
    ar(s_, static_cast<uint8_t>(has_spare_), spare_);
  }
  template <class Archive>
  void load(Archive& ar) {
    uint8_t has_spare = 0;
    ar(s_, has_spare, spare_);
    TAPEFORMER_CHECK(has_spare <= 1, "Rng state: the cached-normal flag must be 0 or 1, got ",
                     static_cast<int>(has_spare));
    has_spare_ = has_spare == 1;
  }

 private:
  template <class F>
  void fill_each(Tensor& t, F&& f);

  std::array<uint64_t, 4> s_{};
  bool has_spare_ = false;
  float spare_ = 0.0f;
};

// The dropout op's mask (autograd/ops.h dropout, Rng::fill_dropout_mask):
// element i of a tensor, in row-major order, is kept when a 32-bit hash
// (murmur3's finaliser) of i and a key from the seed is below (1 - p) 2^32.
// Counter-based: the same on any thread and in any order, so a backward
// regenerates it instead of storing it; 32-bit lanes, so loops vectorise.
struct DropoutMask {
  DropoutMask(uint64_t seed, float p)
      : key(static_cast<uint32_t>(seed ^ (seed >> 32))),
        threshold(static_cast<uint32_t>(std::min(4294967295.0, (1.0 - static_cast<double>(p)) * 4294967296.0))),
        scale(1.0f / (1.0f - p)) {}
  bool keeps(uint32_t i) const {
    uint32_t h = i * 0x9e3779b1u + key;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h < threshold;
  }
  uint32_t key, threshold;
  float scale;  // 1 / (1 - p)
};

// A counter-based uniform in [0, 1) with 24 random bits: the same (seed,
// counter) always gives the same number, in any order and on any thread. For
// masks a backward pass regenerates instead of storing (attention dropout).
// splitmix64's finaliser over seed + counter * golden ratio.
inline float hash_uniform(uint64_t seed, uint64_t counter) {
  uint64_t z = seed + (counter + 1) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

}  // namespace tapeformer
