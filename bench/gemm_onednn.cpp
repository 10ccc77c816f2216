// bf16 matrix products, one core: oneDNN's matmul primitive against
// tapeformer's bf16 GEMM (kernels::gemm under ProductPrecision bf16) and its
// float32 GEMM, on the shapes of bench/gemm_shapes.cpp, the square product
// and flash attention's tile products, in GFLOP/s.
//
//   gemm_onednn [SECONDS_PER_REPEAT] [recipe|large|square|attention|all]   # default 0.1, all
//
// Built as build/bench/gemm_onednn where oneDNN is installed (Debian's
// libdnnl-dev: oneDNN 2.6 on the OpenMP runtime); not a dependency of
// tapeformer (docs/development.md says why it keeps its own kernel).
//
// Columns, each C = A B with A, B float32 in memory and C float32:
//   onednn_bf16: dnnl::matmul on bf16 A and B, converted once beforehand (not
//     timed); fp32 dst.
//   onednn_bf16_with_reorder: the same, plus a reorder of both float32
//     operands to bf16 in every call, as tapeformer's kernel converts (packs)
//     inside the call; this is the like-for-like column.
//   tapeformer_bf16: kernels::gemm under ProductPrecision(Precision::bf16).
//   tapeformer_fp32: kernels::gemm in float32, for reference.
// A transposed A is a transposed view of a row-major (k, m) buffer, given to
// oneDNN as (m, k) with strides (1, m): both libraries read the same memory.
// Every operand stays in its plain row-major layout (no format_tag::any), and
// primitives are created before timing, as a caller that caches them would.
// oneDNN and tapeformer are both held to one thread (oneDNN through its
// threading runtime's own control, see main).
//
// Prints one JSON line per shape: {"shape", "m", "k", "n", "transposed_a",
// "onednn_bf16_gflops", "onednn_bf16_with_reorder_gflops",
// "tapeformer_bf16_gflops", "tapeformer_fp32_gflops"}; each the best of five
// repeats of at least SECONDS_PER_REPEAT. Before timing it checks that
// oneDNN's and tapeformer's bf16 products agree (same bf16 operands, float32
// sums in another order) and exits 1 when they do not. Needs AVX512-BF16.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#elif DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_TBB
#include <oneapi/tbb/global_control.h>
#elif DNNL_CPU_THREADING_RUNTIME != DNNL_RUNTIME_SEQ
#error "gemm_onednn: oneDNN built for a threadpool runtime; this benchmark handles OpenMP, TBB and sequential builds"
#endif

#include "gemm_bench.h"
#include "tapeformer/core/kernels/matmul.h"
#include "tapeformer/core/kernels/precision.h"
#include "tapeformer/core/parallel.h"

namespace tapeformer {
namespace {

using dt = dnnl::memory::data_type;
using Args = std::unordered_map<int, dnnl::memory>;

using bench::gflops;
using bench::GemmShape;

// Largest |x - y| over the (m, n) results, relative to the largest |x|.
double relative_difference(const std::vector<float>& x, const std::vector<float>& y) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(x[i] - y[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(x[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// Times one shape and prints its line; false when the bf16 products disagree.
bool run(const GemmShape& s, double seconds, const dnnl::engine& engine, dnnl::stream& stream) {
  bench::GemmOperands in(s);
  std::vector<float> c_onednn(s.m * s.n), c_ours(s.m * s.n);

  // oneDNN's descriptors: A (m, k) with the strides of its buffer, B (k, n) and C (m, n) row-major.
  const dnnl::memory::dims a_strides = s.transposed_a ? dnnl::memory::dims{1, s.m} : dnnl::memory::dims{s.k, 1};
  const dnnl::memory::dims b_strides{s.n, 1}, c_strides{s.n, 1};
  const dnnl::memory a_f32({{s.m, s.k}, dt::f32, a_strides}, engine, in.a_store.data());
  const dnnl::memory b_f32({{s.k, s.n}, dt::f32, b_strides}, engine, in.b_store.data());
  const dnnl::memory a_bf16({{s.m, s.k}, dt::bf16, a_strides}, engine);
  const dnnl::memory b_bf16({{s.k, s.n}, dt::bf16, b_strides}, engine);
  const dnnl::memory c_f32({{s.m, s.n}, dt::f32, c_strides}, engine, c_onednn.data());
  dnnl::reorder to_bf16_a(a_f32, a_bf16), to_bf16_b(b_f32, b_bf16);
  const dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(a_bf16.get_desc(), b_bf16.get_desc(), c_f32.get_desc()), engine);
  dnnl::matmul product(pd);
  const Args reorder_a{{DNNL_ARG_FROM, a_f32}, {DNNL_ARG_TO, a_bf16}};
  const Args reorder_b{{DNNL_ARG_FROM, b_f32}, {DNNL_ARG_TO, b_bf16}};
  const Args product_args{{DNNL_ARG_SRC, a_bf16}, {DNNL_ARG_WEIGHTS, b_bf16}, {DNNL_ARG_DST, c_f32}};
  const auto onednn = [&] {
    product.execute(stream, product_args);
    stream.wait();
  };
  const auto onednn_with_reorder = [&] {
    to_bf16_a.execute(stream, reorder_a);
    to_bf16_b.execute(stream, reorder_b);
    product.execute(stream, product_args);
    stream.wait();
  };
  const auto ours = [&] { kernels::gemm(in.a, in.b, c_ours.data(), s.n, /*accumulate=*/false); };

  // Same bf16 operands on both sides (round to nearest even; N(0, 1) data has
  // no denormals to flush), so only the float32 sums' order differs.
  onednn_with_reorder();
  double bf16_ours = 0;
  {
    const kernels::ProductPrecision scope(kernels::Precision::bf16);
    ours();
    if (const double d = relative_difference(c_onednn, c_ours); !(d < 1e-4)) {
      std::fprintf(stderr, "gemm_onednn: %s: oneDNN and tapeformer bf16 products differ by %g (relative)\n",
                   s.name.c_str(), d);
      return false;
    }
    bf16_ours = gflops(s, seconds, ours);
  }
  const double bf16_onednn = gflops(s, seconds, onednn);
  const double bf16_onednn_reorder = gflops(s, seconds, onednn_with_reorder);
  const double fp32_ours = gflops(s, seconds, ours);
  std::printf(
      "{\"shape\": \"%s\", \"m\": %lld, \"k\": %lld, \"n\": %lld, \"transposed_a\": %s, "
      "\"onednn_bf16_gflops\": %.1f, \"onednn_bf16_with_reorder_gflops\": %.1f, "
      "\"tapeformer_bf16_gflops\": %.1f, \"tapeformer_fp32_gflops\": %.1f}\n",
      s.name.c_str(), static_cast<long long>(s.m), static_cast<long long>(s.k), static_cast<long long>(s.n),
      s.transposed_a ? "true" : "false", bf16_onednn, bf16_onednn_reorder, bf16_ours, fp32_ours);
  std::fflush(stdout);
  return true;
}

// A set of bench/gemm_bench.h, each shape named with the set ("recipe qkv forward").
std::vector<GemmShape> named(const std::string& set, std::vector<GemmShape> shapes) {
  for (GemmShape& s : shapes) s.name = set + " " + s.name;
  return shapes;
}

std::vector<GemmShape> attention_shapes() {
  // Flash attention's products on 64 x 64 tiles with head dim 64 (core/kernels/flash_attention.cpp):
  // S = Q K^T (K^T copied to a tile), dV += P^T dY (P^T a transposed view), and one 16-row group of a
  // tile the causal diagonal crosses.
  return {
      {"attention tile", 64, 64, 64, false},
      {"attention tile A^T", 64, 64, 64, true},
      {"attention 16-row group", 16, 64, 64, false},
  };
}

}  // namespace
}  // namespace tapeformer

int main(int argc, char** argv) {
  using tapeformer::GemmShape;
  const double seconds =
      tapeformer::bench::seconds_argument(argc, argv, "0.1", "gemm_onednn", "SECONDS_PER_REPEAT");
  if (!(seconds > 0)) return 2;
  const std::string which = argc > 2 ? argv[2] : "all";
  if (which != "recipe" && which != "large" && which != "square" && which != "attention" && which != "all") {
    std::fprintf(stderr,
                 "gemm_onednn: the shape set must be 'recipe', 'large', 'square', 'attention' or 'all', got '%s'\n",
                 which.c_str());
    return 2;
  }
  if (const std::string why = tapeformer::kernels::bf16_unsupported(); !why.empty()) {
    std::fprintf(stderr, "gemm_onednn: %s\n", why.c_str());
    return 2;
  }

  // One thread for both libraries. oneDNN sizes its parallel regions from its
  // threading runtime: OpenMP's thread count, or TBB's parallelism limit,
  // which tapeformer's parallel::set_num_threads may also set (the smaller
  // limit wins). A sequential build has one thread already.
  tapeformer::parallel::set_num_threads(1);
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  omp_set_num_threads(1);
#elif DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_TBB
  const tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
#endif

  std::vector<GemmShape> shapes;
  const auto add = [&](const std::vector<GemmShape>& set) { shapes.insert(shapes.end(), set.begin(), set.end()); };
  if (which == "recipe" || which == "all") add(tapeformer::named("recipe", tapeformer::bench::recipe_shapes()));
  if (which == "large" || which == "all") add(tapeformer::named("large", tapeformer::bench::large_shapes()));
  if (which == "square" || which == "all") add(tapeformer::bench::square_shapes());
  if (which == "attention" || which == "all") add(tapeformer::attention_shapes());

  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  for (const GemmShape& s : shapes) {
    if (!tapeformer::run(s, seconds, engine, stream)) return 1;
  }
  return 0;
}
