// The machine's measured float32 peaks, the yardsticks of the benchmarks'
// model-FLOP rates: a pure fused-multiply-add loop in registers (no memory
// traffic) on one core and on every core at once, and tapeformer's GEMM on a
// large square product (n = 1536) on one core and on every core.
//
//   machine_peak [SECONDS [THREADS...]]   # default 1 s per measurement; 1 and all threads
//
// Prints one JSON line per thread count: {"isa", "packet_floats", "threads",
// "fma_gflops", "gemm_gflops"}. The FMA loop uses the instruction set the
// build targets (Eigen's packets), as the kernels do.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/kernels/matmul.h"
#include "tapeformer/core/numbers.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/rng.h"

namespace tapeformer {
namespace {

using clock_type = std::chrono::steady_clock;
using eigen::Packet;
constexpr int kChains = 10;  // independent accumulators: covers FMA latency x throughput (4 x 2 on most cores)

// FMAs in registers for `iterations` rounds; returns a value so nothing is optimised away.
float fma_loop(int64_t iterations) {
  using namespace Eigen::internal;
  Packet acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = pset1<Packet>(static_cast<float>(c) * 1e-3f);
  const Packet a = pset1<Packet>(0.999999f), b = pset1<Packet>(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = pmadd(acc[c], a, b);
  }
  Packet sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = padd(sum, acc[c]);
  return predux(sum);
}

// GFLOP/s of the FMA loop on `threads` threads at once (each its own loop).
double fma_gflops(int threads, double seconds) {
  parallel::set_num_threads(threads);
  const double flops_per_iteration = 2.0 * kChains * eigen::kPacketSize;
  // Calibrate on one thread: iterations for about `seconds`.
  int64_t iterations = 1 << 20;
  for (;;) {
    const auto t0 = clock_type::now();
    volatile float sink = fma_loop(iterations);
    (void)sink;
    const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (s > 0.05) {
      iterations = static_cast<int64_t>(static_cast<double>(iterations) * seconds / s);
      break;
    }
    iterations *= 4;
  }
  std::atomic<float> keep{0};
  const auto t0 = clock_type::now();
  parallel::parallel_for(threads, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) keep = keep + fma_loop(iterations);
  });
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  return flops_per_iteration * static_cast<double>(iterations) * threads / s / 1e9;
}

// GFLOP/s of batched_matmul on an n x n x n product, best of several calls.
double gemm_gflops(int threads, double seconds) {
  parallel::set_num_threads(threads);
  const int64_t n = 1536;
  Rng rng(1);
  Tensor a = Tensor::empty({n, n}), b = Tensor::empty({n, n}), c = Tensor::empty({n, n});
  rng.fill_normal(a, 0.0f, 1.0f);
  rng.fill_normal(b, 0.0f, 1.0f);
  kernels::batched_matmul(a, b, c);  // warm up
  double best = 0, spent = 0;
  while (spent < seconds) {
    const auto t0 = clock_type::now();
    kernels::batched_matmul(a, b, c);
    const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    spent += s;
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}

const char* isa() {
#if defined(EIGEN_VECTORIZE_AVX512)
  return "AVX-512";
#elif defined(EIGEN_VECTORIZE_AVX2)
  return "AVX2";
#elif defined(EIGEN_VECTORIZE_AVX)
  return "AVX";
#elif defined(EIGEN_VECTORIZE_SSE2)
  return "SSE2";
#else
  return "scalar";
#endif
}

}  // namespace
}  // namespace tapeformer

int main(int argc, char** argv) {
  using namespace tapeformer;
  // The arguments are read by core/numbers.h (not std::atof or std::atoi, which take "abc" as 0 and "2s" as 2):
  // text that is no number is NaN or 0 here, so it gets the error line of a value out of range, not an uncaught
  // exception.
  const std::string seconds_text = argc > 1 ? argv[1] : "1";
  const double seconds =
      number_error<double>(seconds_text).empty() ? parse_number<double>(seconds_text, "SECONDS") : std::nan("");
  if (!(seconds > 0)) {
    std::fprintf(stderr, "machine_peak: SECONDS must be a positive number, got '%s'\n", seconds_text.c_str());
    return 2;
  }
  parallel::set_num_threads(0);
  std::vector<int> counts;
  for (int i = 2; i < argc; ++i) {
    const int t = number_error<int>(argv[i]).empty() ? parse_number<int>(argv[i], "THREADS") : 0;
    if (t < 1 || t > 1024) {
      std::fprintf(stderr, "machine_peak: a thread count must be in [1, 1024], got '%s'\n", argv[i]);
      return 2;
    }
    counts.push_back(t);
  }
  if (counts.empty()) counts = {1, parallel::num_threads()};
  for (int t : counts) {
    const double fma = fma_gflops(t, seconds), gemm = gemm_gflops(t, seconds);
    std::printf("{\"isa\": \"%s\", \"packet_floats\": %d, \"threads\": %d, \"fma_gflops\": %.1f, \"gemm_gflops\": %.1f}\n",
                isa(), eigen::kPacketSize, t, fma, gemm);
    std::fflush(stdout);
  }
  return 0;
}
