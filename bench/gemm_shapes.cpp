// Matrix products of the nanoGPT CPU recipe, one core: tapeformer's packet
// GEMM (kernels::gemm) and Eigen's GEMM on the same operands, in GFLOP/s.
// bench/gemm_vs_pytorch.sh runs this, then bench/gemm_shapes.py (torch.mm,
// one thread) on the same shapes, and prints the ratios.
//
//   gemm_shapes [SECONDS_PER_SHAPE] [recipe|large|square]   # default 0.5, recipe
//
// The shapes are one data-parallel shard's linear-layer products in a
// training step of the recipe (batch 12 x block 64 split in 2 shards: 384
// rows; width 128, MLP 512, qkv 384, vocabulary 65): forward X W, backward
// dX = dY W^T (with W^T copied to contiguous rows, as the layers do) and
// dW = X^T dY (X^T a transposed view, as the layers pass it). The tied head's
// forward reads the embedding transposed, which the layer copies first; that
// copy is not timed here. Attention's batched products are not included.
// Prints one JSON line per shape: {"shape", "m", "k", "n", "transposed_a",
// "tapeformer_gflops", "eigen_gflops", "tapeformer_bf16_gflops"} (bf16
// operands, core/kernels/precision.h; null on a CPU without AVX512-BF16).
// Best of five timed repeats each.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/kernels/matmul.h"
#include "tapeformer/core/kernels/precision.h"
#include "tapeformer/core/numbers.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/rng.h"

namespace tapeformer {
namespace {

struct GemmShape {
  const char* name;
  int64_t m, k, n;
  bool transposed_a;  // A is X^T: a transposed view of a row-major (k, m) tensor
};

// Operations per second of f (one product of 2mkn flops), best of five
// repeats of at least `seconds` / 5 each.
template <class F>
double gflops(int64_t m, int64_t k, int64_t n, double seconds, F&& f) {
  using clock = std::chrono::steady_clock;
  f();  // warm caches and code
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    int64_t calls = 0;
    const auto t0 = clock::now();
    double elapsed = 0;
    while (elapsed < seconds / 5) {
      f();
      ++calls;
      elapsed = std::chrono::duration<double>(clock::now() - t0).count();
    }
    best = std::max(best, 2.0 * m * k * n * calls / elapsed / 1e9);
  }
  return best;
}

void run(const GemmShape& s, double seconds) {
  Rng rng(1);
  // A as stored: (m, k) row-major, or (k, m) row-major read transposed.
  Tensor a_store = s.transposed_a ? Tensor::empty({s.k, s.m}) : Tensor::empty({s.m, s.k});
  Tensor b = Tensor::empty({s.k, s.n}), c = Tensor::empty({s.m, s.n});
  rng.fill_normal(a_store, 0.0f, 1.0f);
  rng.fill_normal(b, 0.0f, 1.0f);
  const kernels::MatRef a_ref = s.transposed_a ? kernels::MatRef{a_store.data(), s.m, s.k, 1, s.m}
                                               : kernels::MatRef{a_store.data(), s.m, s.k, s.k, 1};
  const kernels::MatRef b_ref{b.data(), s.k, s.n, s.n, 1};
  const double ours = gflops(s.m, s.k, s.n, seconds, [&] {
    kernels::gemm(a_ref, b_ref, c.data(), s.n, /*accumulate=*/false);
  });
  // bf16 operands on the CPU's dot-product instructions, where it has them.
  double bf16 = 0;
  if (kernels::bf16_unsupported().empty()) {
    const kernels::ProductPrecision scope(kernels::Precision::bf16);
    bf16 = gflops(s.m, s.k, s.n, seconds, [&] { kernels::gemm(a_ref, b_ref, c.data(), s.n, /*accumulate=*/false); });
  }

  const auto a_rows = eigen::matrix(static_cast<const Scalar*>(a_store.data()), s.m, s.k);  // unless transposed
  const auto a_cols = eigen::col_matrix(a_store.data(), s.m, s.k, s.m);                    // A^T stored row-major
  const auto b_map = eigen::matrix(static_cast<const Scalar*>(b.data()), s.k, s.n);
  auto c_map = eigen::matrix(c.data(), s.m, s.n);
  const double eigen = gflops(s.m, s.k, s.n, seconds, [&] {
    if (s.transposed_a) c_map.noalias() = a_cols * b_map;
    else c_map.noalias() = a_rows * b_map;
  });
  std::printf(
      "{\"shape\": \"%s\", \"m\": %lld, \"k\": %lld, \"n\": %lld, \"transposed_a\": %s, "
      "\"tapeformer_gflops\": %.1f, \"eigen_gflops\": %.1f, \"tapeformer_bf16_gflops\": %s}\n",
      s.name, static_cast<long long>(s.m), static_cast<long long>(s.k), static_cast<long long>(s.n),
      s.transposed_a ? "true" : "false", ours, eigen, bf16 > 0 ? std::to_string(bf16).c_str() : "null");
  std::fflush(stdout);
}

}  // namespace
}  // namespace tapeformer

int main(int argc, char** argv) {
  using tapeformer::GemmShape;
  // SECONDS_PER_SHAPE is read by core/numbers.h (not std::atof, which takes "abc" as 0 and "2s" as 2): text
  // that is no finite number is NaN here, so it gets the error line of a value <= 0, not an uncaught exception.
  const std::string seconds_text = argc > 1 ? argv[1] : "0.5";
  const double seconds = tapeformer::number_error<double>(seconds_text).empty()
                             ? tapeformer::parse_number<double>(seconds_text, "SECONDS_PER_SHAPE")
                             : std::nan("");
  if (!(seconds > 0)) {
    std::fprintf(stderr, "gemm_shapes: SECONDS_PER_SHAPE must be a positive number, got '%s'\n",
                 seconds_text.c_str());
    return 2;
  }
  tapeformer::parallel::set_num_threads(1);
  Eigen::setNbThreads(1);
  const std::vector<GemmShape> recipe = {
      {"qkv forward", 384, 128, 384, false},     {"attn proj forward", 384, 128, 128, false},
      {"mlp fc forward", 384, 128, 512, false},  {"mlp proj forward", 384, 512, 128, false},
      {"head forward", 384, 128, 65, false},     {"qkv dX", 384, 384, 128, false},
      {"mlp fc dX", 384, 512, 128, false},       {"mlp proj dX", 384, 128, 512, false},
      {"qkv dW", 128, 384, 384, true},           {"mlp fc dW", 128, 384, 512, true},
      {"mlp proj dW", 512, 384, 128, true},      {"attn proj dW", 128, 384, 128, true},
      {"head dX", 384, 65, 128, false},          {"head dW", 65, 384, 128, true},
  };
  // nanoGPT's default shakespeare_char model (configs/shakespeare_char.json):
  // batch 64 x block 256 in 2 shards = 8192 rows, width 384, MLP 1536.
  const std::vector<GemmShape> large = {
      {"qkv forward", 8192, 384, 1152, false},   {"attn proj forward", 8192, 384, 384, false},
      {"mlp fc forward", 8192, 384, 1536, false}, {"mlp proj forward", 8192, 1536, 384, false},
      {"head forward", 8192, 384, 65, false},    {"qkv dX", 8192, 1152, 384, false},
      {"mlp fc dX", 8192, 1536, 384, false},     {"mlp proj dX", 8192, 384, 1536, false},
      {"qkv dW", 384, 8192, 1152, true},         {"mlp fc dW", 384, 8192, 1536, true},
      {"mlp proj dW", 1536, 8192, 384, true},    {"attn proj dW", 384, 8192, 384, true},
      {"head dX", 8192, 65, 384, false},         {"head dW", 65, 8192, 384, true},
  };
  // The square product machine_peak and scale.py time.
  const std::vector<GemmShape> square = {{"square", 1536, 1536, 1536, false}};
  const std::string which = argc > 2 ? argv[2] : "recipe";
  if (which != "recipe" && which != "large" && which != "square") {
    std::fprintf(stderr, "gemm_shapes: the shape set must be 'recipe', 'large' or 'square', got '%s'\n",
                 which.c_str());
    return 2;
  }
  const std::vector<GemmShape>& shapes = which == "large" ? large : which == "square" ? square : recipe;
  for (const GemmShape& s : shapes) tapeformer::run(s, seconds);
  return 0;
}
