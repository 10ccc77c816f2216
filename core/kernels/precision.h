// The precision of matrix products' operands (train.precision).
//
//   if (const std::string why = bf16_unsupported(); !why.empty()) fail(why);
//   ProductPrecision bf16(Precision::bf16);   // every gemm in this process, until it ends
//   model.forward(...); backward(loss);       // products: bf16 operands, fp32 sums
//
// fp32: operands and sums in float32 (the default).
// bf16: each operand rounded to bfloat16 (8 bits of mantissa: round to
//   nearest even, a denormal flushed to a zero of its sign) and multiplied on
//   the CPU's dot-product instruction (AVX512-BF16's vdpbf16ps): a bf16
//   product is exact in float32, and the sum over k stays float32, as pairs
//   (k = 2p, 2p + 1) in order, each step an FMA of the odd product and then
//   of the even one, denormal sums flushed to zero. Everything else (norms,
//   softmax, the loss, reductions, weights, optimizer state) stays float32.
// bf16_portable: the same arithmetic on any CPU (operands rounded in
//   software, the float32 kernel summing the pairs in the same order with
//   denormal results flushed): the reference the fast path is tested
//   against, equal to it bit for bit.
//
// The precision is process-wide: every thread's products follow it, so a
// run's data-parallel shards and TBB workers agree, and the bits do not
// depend on the thread count (the sums' order is fixed, as in float32).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace tapeformer::kernels {

enum class Precision { fp32, bf16, bf16_portable };

// The precision products use now.
Precision product_precision();

// Sets the process's product precision for its lifetime, then restores the
// one before. Error for bf16 on a CPU without the instructions
// (bf16_unsupported()).
class ProductPrecision {
 public:
  explicit ProductPrecision(Precision p);
  ~ProductPrecision();
  ProductPrecision(const ProductPrecision&) = delete;
  ProductPrecision& operator=(const ProductPrecision&) = delete;

 private:
  Precision before_;
};

// "" when this CPU runs bf16 products; else why not, naming the
// instructions it lacks ("this CPU has no AVX512-BF16 (avx512_bf16 in
// /proc/cpuinfo) ...").
std::string bf16_unsupported();

// x rounded to bfloat16, as its 16 bits: round to nearest even, a NaN kept a
// (quiet) NaN, a denormal flushed to the zero of its sign, as AVX512-BF16's
// conversions do.
inline uint16_t to_bf16(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);  // zero or denormal
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN, quiet
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// The float a bfloat16 stands for (a denormal one read as zero, as the dot
// product instruction reads it).
inline float from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  float x = 0;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
// x as the float its bfloat16 rounding stands for.
inline float round_bf16(float x) { return from_bf16(to_bf16(x)); }

}  // namespace tapeformer::kernels
