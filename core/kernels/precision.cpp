#include "tapeformer/core/kernels/precision.h"

#include <atomic>

#include "tapeformer/core/error.h"

namespace tapeformer::kernels {
namespace {

std::atomic<Precision> g_precision{Precision::fp32};

}  // namespace

Precision product_precision() { return g_precision.load(std::memory_order_relaxed); }

ProductPrecision::ProductPrecision(Precision p) : before_(product_precision()) {
  if (p == Precision::bf16) {
    const std::string why = bf16_unsupported();
    TAPEFORMER_CHECK(why.empty(), why);
  }
  g_precision.store(p, std::memory_order_relaxed);
}

ProductPrecision::~ProductPrecision() { g_precision.store(before_, std::memory_order_relaxed); }

std::string bf16_unsupported() {
#if defined(__x86_64__) && defined(__GNUC__)
  std::string missing;
  const auto lacks = [&](bool has, const char* name) {
    if (!has) missing += (missing.empty() ? "" : ", ") + std::string(name);
  };
  lacks(__builtin_cpu_supports("avx512f"), "AVX-512 (avx512f)");
  lacks(__builtin_cpu_supports("avx512bw"), "AVX512-BW (avx512bw)");
  lacks(__builtin_cpu_supports("avx512bf16"), "AVX512-BF16 (avx512_bf16)");
  if (missing.empty()) return "";
  return "train.precision \"bf16\" needs a CPU with bfloat16 dot products, and this one has no " + missing +
         " (see /proc/cpuinfo's flags); train in \"fp32\" on it";
#else
  return "train.precision \"bf16\" needs an x86-64 CPU with AVX512-BF16 (avx512_bf16); train in \"fp32\" on this one";
#endif
}

}  // namespace tapeformer::kernels
