// What the library was compiled for, as far as its results depend on it.
//
//   std::string v = vector_description();
//   // "16-float packets in 16-float registers, FMA (AVX512, FMA, AVX SSE, ...)"
//
// A run's bits depend on the seed and the shard count, not on the thread
// count, the number of processes or the vector registers: every kernel
// reduces over 16-float packets (two 8-float registers with AVX2) and uses
// fused multiply-adds where it says so, which needs FMA (x86-64-v3).
// `tapeformer --version` prints what the build uses.
#pragma once

#include <string>

namespace tapeformer {

// "<lanes>-float packets in <lanes>-float registers" and ", FMA" when fused
// multiply-adds are compiled in, then Eigen's list of the instruction sets in
// use, in parentheses.
std::string vector_description();

}  // namespace tapeformer
