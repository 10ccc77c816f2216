// Parallelism for all of tapeformer. This is the only file that touches oneTBB;
// nothing else spawns threads (Eigen is built single-threaded), so BLAS/OpenMP
// threads never fight TBB.
//
//   parallel::set_num_threads(2);           // 0 = the default (below)
//   parallel::parallel_for(rows, 16, [&](int64_t r0, int64_t r1) { ... });
//
// The default thread count is $TAPEFORMER_THREADS when set, else the number of
// hardware threads. Chunk boundaries depend only on (n, grain, num_threads()),
// and every output element is written by one chunk, so a run is bit-for-bit
// reproducible for a given thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace tapeformer::parallel {

// Sets the number of worker threads (n >= 1, or 0 for the default:
// $TAPEFORMER_THREADS when set, else the hardware count).
void set_num_threads(int n);
int num_threads();

// Calls fn(begin, end) on disjoint chunks covering [0, n), each at least
// `grain` long (except the last), in parallel when there is more than one chunk.
// Inside a parallel region (a chunk, or an invoke branch) it runs serially:
// the outer level already occupies the threads.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// Splits each of several buffers (sizes[i] elements) into fixed blocks of
// `block` elements (the last block of a buffer may be shorter) and calls
// fn(i, begin, end) once per block, all blocks of all buffers in one parallel
// loop. Use it for passes over many tensors of mixed sizes (gradients,
// optimizer state): one fork/join per pass instead of one per tensor, and
// block boundaries that depend only on sizes and block, never on the thread
// count.
//
//   parallel::for_each_block(sizes, 4096, [&](size_t i, int64_t b, int64_t e) { scale(grads[i], b, e); });
void for_each_block(const std::vector<int64_t>& sizes, int64_t block,
                    const std::function<void(size_t, int64_t, int64_t)>& fn);

// True inside a parallel region (a chunk of parallel_for, or an invoke
// branch), where parallel loops run serially: a kernel can skip splitting
// its work (a data-parallel shard's ops all run here).
bool in_parallel_region();

// Runs a and b concurrently (serially inside a parallel region or with one
// thread). Use it for independent pieces of work, e.g. the two GEMMs of a
// linear layer's backward, each of which then runs unsplit.
void invoke(const std::function<void()>& a, const std::function<void()>& b);

}  // namespace tapeformer::parallel
