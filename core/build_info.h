// What the library was compiled for, as far as its results depend on it.
//
//   std::string v = vector_description();   // "16-float vectors, FMA (AVX512, FMA, AVX SSE, ...)"
//
// A run's bits depend on the seed, the shard count and the vector width the
// kernels were compiled for (the lanes a reduction is split over), not on
// the thread count or the number of processes. `tapeformer --version` prints it.
#pragma once

#include <string>

namespace tapeformer {

// "<lanes>-float vectors" and ", FMA" when fused multiply-adds are compiled
// in, then Eigen's list of the instruction sets in use, in parentheses.
std::string vector_description();

}  // namespace tapeformer
