// What the one-core GEMM benchmarks share (bench/gemm_shapes.cpp,
// bench/gemm_onednn.cpp): the product shapes of the two recipes, their
// operands, the timer and the seconds argument.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tapeformer/core/kernels/matref.h"
#include "tapeformer/core/numbers.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/core/tensor.h"

namespace tapeformer::bench {

// C (m, n) = A (m, k) B (k, n).
struct GemmShape {
  std::string name;
  int64_t m, k, n;
  bool transposed_a;  // A is X^T: a transposed view of a row-major (k, m) tensor
};

// One data-parallel shard's linear-layer products in a training step: forward
// X W, backward dX = dY W^T (W^T copied to contiguous rows, as the layers do)
// and dW = X^T dY (X^T a transposed view, as the layers pass it). The tied
// head's forward reads the embedding transposed, which the layer copies first.
// The nanoGPT CPU recipe: batch 12 x block 64 in 2 shards = 384 rows, width
// 128, MLP 512, qkv 384, vocabulary 65.
inline std::vector<GemmShape> recipe_shapes() {
  return {
      {"qkv forward", 384, 128, 384, false},    {"attn proj forward", 384, 128, 128, false},
      {"mlp fc forward", 384, 128, 512, false}, {"mlp proj forward", 384, 512, 128, false},
      {"head forward", 384, 128, 65, false},    {"qkv dX", 384, 384, 128, false},
      {"mlp fc dX", 384, 512, 128, false},      {"mlp proj dX", 384, 128, 512, false},
      {"qkv dW", 128, 384, 384, true},          {"mlp fc dW", 128, 384, 512, true},
      {"mlp proj dW", 512, 384, 128, true},     {"attn proj dW", 128, 384, 128, true},
      {"head dX", 384, 65, 128, false},         {"head dW", 65, 384, 128, true},
  };
}

// nanoGPT's default shakespeare_char model (configs/shakespeare_char.json):
// batch 64 x block 256 in 2 shards = 8192 rows, width 384, MLP 1536.
inline std::vector<GemmShape> large_shapes() {
  return {
      {"qkv forward", 8192, 384, 1152, false},    {"attn proj forward", 8192, 384, 384, false},
      {"mlp fc forward", 8192, 384, 1536, false}, {"mlp proj forward", 8192, 1536, 384, false},
      {"head forward", 8192, 384, 65, false},     {"qkv dX", 8192, 1152, 384, false},
      {"mlp fc dX", 8192, 1536, 384, false},      {"mlp proj dX", 8192, 384, 1536, false},
      {"qkv dW", 384, 8192, 1152, true},          {"mlp fc dW", 384, 8192, 1536, true},
      {"mlp proj dW", 1536, 8192, 384, true},     {"attn proj dW", 384, 8192, 384, true},
      {"head dX", 8192, 65, 384, false},          {"head dW", 65, 8192, 384, true},
  };
}

// The square product machine_peak and scale.py time.
inline std::vector<GemmShape> square_shapes() { return {{"square", 1536, 1536, 1536, false}}; }

// A shape's operands, N(0, 1): A as stored ((m, k) row-major, or (k, m)
// row-major read transposed) and B (k, n) row-major, with their MatRefs.
struct GemmOperands {
  explicit GemmOperands(const GemmShape& s)
      : a_store(s.transposed_a ? Tensor::empty({s.k, s.m}) : Tensor::empty({s.m, s.k})),
        b_store(Tensor::empty({s.k, s.n})) {
    Rng rng(1);
    rng.fill_normal(a_store, 0.0f, 1.0f);
    rng.fill_normal(b_store, 0.0f, 1.0f);
    a = s.transposed_a ? kernels::MatRef{a_store.data(), s.m, s.k, 1, s.m}
                       : kernels::MatRef{a_store.data(), s.m, s.k, s.k, 1};
    b = kernels::MatRef{b_store.data(), s.k, s.n, s.n, 1};
  }
  Tensor a_store, b_store;
  kernels::MatRef a{}, b{};
};

// Operations per second of f (one product of 2mkn flops) in GFLOP/s, best of
// five repeats of at least `repeat_seconds` each, after one warm-up call.
template <class F>
double gflops(const GemmShape& s, double repeat_seconds, F&& f) {
  using clock = std::chrono::steady_clock;
  f();  // warm caches and code
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    int64_t calls = 0;
    const auto t0 = clock::now();
    double elapsed = 0;
    while (elapsed < repeat_seconds) {
      f();
      ++calls;
      elapsed = std::chrono::duration<double>(clock::now() - t0).count();
    }
    best = std::max(best, 2.0 * s.m * s.k * s.n * calls / elapsed / 1e9);
  }
  return best;
}

// argv[1] (or `fallback`) as seconds, read by core/numbers.h (not std::atof,
// which takes "abc" as 0 and "2s" as 2); NaN after printing
// "PROGRAM: WHAT must be a positive number, got '...'" when it is no
// positive finite number.
inline double seconds_argument(int argc, char** argv, const char* fallback, const char* program, const char* what) {
  const std::string text = argc > 1 ? argv[1] : fallback;
  const double seconds = number_error<double>(text).empty() ? parse_number<double>(text, what) : std::nan("");
  if (!(seconds > 0)) {
    std::fprintf(stderr, "%s: %s must be a positive number, got '%s'\n", program, what, text.c_str());
    return std::nan("");
  }
  return seconds;
}

}  // namespace tapeformer::bench
