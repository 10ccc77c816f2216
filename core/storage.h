// Storage: a 64-byte-aligned float32 buffer shared by tensors and their views.
//
// Live storages and bytes are counted process-wide so tests can prove that
// saved tensors are released (see `Storage::live_count()`). Freed buffers are
// kept in a per-size cache (up to max(1 GiB, twice the peak of live bytes)) and reused, because a training step
// allocates the same sizes every iteration; `release_cache()` frees them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tapeformer {

using Scalar = float;  // the one compute type (STYLE rule 10)

class Storage {
 public:
  static constexpr size_t kAlignment = 64;
  // Largest n accepted (2^56 floats = 256 PiB: beyond any address space, far
  // below where the byte count would overflow).
  static constexpr int64_t kMaxElements = int64_t{1} << 56;

  // Uninitialised buffer of n floats (n may be 0).
  explicit Storage(int64_t n);
  // n floats of memory this Storage does not own (memory the ranks of a
  // distributed run share): never freed, cached or counted here; it must
  // outlive every tensor over it.
  static std::shared_ptr<Storage> borrow(Scalar* data, int64_t n);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Scalar* data() { return data_; }
  const Scalar* data() const { return data_; }
  int64_t size() const { return size_; }

  // Number of Storage objects alive in the process, and their total bytes.
  static int64_t live_count();
  static int64_t live_bytes();
  // The most live bytes since the last reset_peak() (memory benchmarks: what
  // a computation needs at its worst moment). Counting starts with the first
  // reset_peak(), so a program that never asks pays nothing per allocation;
  // before it, peak_bytes() is -1.
  static int64_t peak_bytes();
  static void reset_peak();
  // Bytes of every Storage created since the process started, and of those
  // the cache could not serve, which came from the system allocator (a
  // training step in steady state takes none).
  static int64_t requested_bytes();
  static int64_t system_bytes();
  // Bytes held in the reuse cache (not counted as live), and freeing them.
  static int64_t cached_bytes();
  static void release_cache();

  // Reuse arenas: while an ArenaScope(k) is alive, this thread's storages
  // come from arena k's cached blocks, and each block returns to the arena
  // it came from, whichever thread frees it. Data-parallel shards run each
  // in its own arena: a shard's ops run in a fixed order, so its arena sees
  // the same demand every step, whereas in one shared cache the shards'
  // interleaving (which differs run to run) could ask for one more block of
  // a size than any step before and take it from malloc. Arena 0 is the
  // default.
  class ArenaScope {
   public:
    explicit ArenaScope(int arena);
    ~ArenaScope();
    ArenaScope(const ArenaScope&) = delete;
    ArenaScope& operator=(const ArenaScope&) = delete;

   private:
    int previous_;
  };
  static constexpr int kMaxArenas = 1024;

  // Raises glibc's mmap/trim thresholds so freed memory stays mapped: Eigen's
  // GEMM workspaces and other per-step temporaries then stop page-faulting
  // every step (measured: ~3000 faults and ~20% of a training step). It is
  // process-wide, so the library never does it implicitly: the Trainer and
  // the `tapeformer` command call it.
  static void keep_freed_memory_mapped();

 private:
  Storage() = default;  // borrow()'s

  Scalar* data_ = nullptr;
  int64_t size_ = 0;
  int arena_ = 0;
  bool owned_ = true;
};

}  // namespace tapeformer
