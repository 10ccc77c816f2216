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
#include <cstdio>
#include <string>
#include <vector>

#include "gemm_bench.h"
#include "tapeformer/core/eigen.h"
#include "tapeformer/core/kernels/matmul.h"
#include "tapeformer/core/kernels/precision.h"
#include "tapeformer/core/parallel.h"

namespace tapeformer {
namespace {

using bench::GemmShape;

// SECONDS_PER_SHAPE is split over gflops()'s five repeats.
void run(const GemmShape& s, double seconds) {
  const bench::GemmOperands in(s);
  Tensor c = Tensor::empty({s.m, s.n});
  const double ours = bench::gflops(s, seconds / 5, [&] {
    kernels::gemm(in.a, in.b, c.data(), s.n, /*accumulate=*/false);
  });
  // bf16 operands on the CPU's dot-product instructions, where it has them.
  double bf16 = 0;
  if (kernels::bf16_unsupported().empty()) {
    const kernels::ProductPrecision scope(kernels::Precision::bf16);
    bf16 = bench::gflops(s, seconds / 5, [&] { kernels::gemm(in.a, in.b, c.data(), s.n, /*accumulate=*/false); });
  }

  const auto a_rows = eigen::matrix(static_cast<const Scalar*>(in.a_store.data()), s.m, s.k);  // unless transposed
  const auto a_cols = eigen::col_matrix(in.a_store.data(), s.m, s.k, s.m);                    // A^T stored row-major
  const auto b_map = eigen::matrix(static_cast<const Scalar*>(in.b_store.data()), s.k, s.n);
  auto c_map = eigen::matrix(c.data(), s.m, s.n);
  const double eigen = bench::gflops(s, seconds / 5, [&] {
    if (s.transposed_a) c_map.noalias() = a_cols * b_map;
    else c_map.noalias() = a_rows * b_map;
  });
  std::printf(
      "{\"shape\": \"%s\", \"m\": %lld, \"k\": %lld, \"n\": %lld, \"transposed_a\": %s, "
      "\"tapeformer_gflops\": %.1f, \"eigen_gflops\": %.1f, \"tapeformer_bf16_gflops\": %s}\n",
      s.name.c_str(), static_cast<long long>(s.m), static_cast<long long>(s.k), static_cast<long long>(s.n),
      s.transposed_a ? "true" : "false", ours, eigen, bf16 > 0 ? std::to_string(bf16).c_str() : "null");
  std::fflush(stdout);
}

}  // namespace
}  // namespace tapeformer

int main(int argc, char** argv) {
  using namespace tapeformer::bench;
  const double seconds = seconds_argument(argc, argv, "0.5", "gemm_shapes", "SECONDS_PER_SHAPE");
  if (!(seconds > 0)) return 2;
  tapeformer::parallel::set_num_threads(1);
  Eigen::setNbThreads(1);
  const std::string which = argc > 2 ? argv[2] : "recipe";
  if (which != "recipe" && which != "large" && which != "square") {
    std::fprintf(stderr, "gemm_shapes: the shape set must be 'recipe', 'large' or 'square', got '%s'\n",
                 which.c_str());
    return 2;
  }
  const std::vector<GemmShape> shapes =
      which == "large" ? large_shapes() : which == "square" ? square_shapes() : recipe_shapes();
  for (const GemmShape& s : shapes) tapeformer::run(s, seconds);
  return 0;
}
