#include "tapeformer/core/storage.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "tapeformer/core/error.h"

namespace tapeformer {
namespace {
std::atomic<int64_t> g_live_count{0};
std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_peak_bytes{-1};
std::atomic<bool> g_tracking_peak{false};  // set by the first reset_peak()
std::atomic<int64_t> g_requested_bytes{0};
std::atomic<int64_t> g_system_bytes{0};
std::atomic<int64_t> g_high_water{0};  // the most live bytes ever, always tracked (bounds the cache)

// A training step allocates the same buffer sizes every iteration. Keeping
// freed blocks by exact size avoids returning them to the OS and faulting the
// pages in again next step (this was ~20% of a step's time). The cache holds
// at most max(1 GiB, twice the most bytes ever live at once): a step of a
// large model frees and takes again more than any fixed bound (the 10.7M
// model's step, about 5 GB), and past the bound every step went back to
// malloc for gigabytes. At the end of a step the cache holds every
// activation of every shard plus the freed gradients, a little more than the
// peak live bytes, hence the factor 2; a program's cache stays within twice
// its own peak.
class BlockCache {
 public:
  static constexpr int64_t kMinCapBytes = int64_t{1} << 30;

  void* take(size_t bytes, int arena) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(key(bytes, arena));
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= bytes;
        return p;
      }
    }
    g_system_bytes.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    void* p = std::aligned_alloc(Storage::kAlignment, bytes);
    if (!p) {
      release();  // give cached memory back and retry once
      p = std::aligned_alloc(Storage::kAlignment, bytes);
      if (!p) throw std::bad_alloc();
    }
    return p;
  }

  void give(void* p, size_t bytes, int arena) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const int64_t cap = std::max(kMinCapBytes, 2 * g_high_water.load(std::memory_order_relaxed));
      if (static_cast<int64_t>(cached_ + bytes) <= cap) {
        free_[key(bytes, arena)].push_back(p);
        cached_ += bytes;
        return;
      }
    }
    std::free(p);
  }

  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [k, blocks] : free_)
      for (void* p : blocks) std::free(p);
    free_.clear();
    cached_ = 0;
  }

  size_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }

 private:
  static uint64_t key(size_t bytes, int arena) { return static_cast<uint64_t>(bytes) * Storage::kMaxArenas + arena; }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};

BlockCache& cache() {
  static BlockCache* c = new BlockCache();  // never destroyed: storages may outlive statics
  return *c;
}

thread_local int t_arena = 0;

// Raises `high` to at least `value` (many threads may race).
void raise_to(std::atomic<int64_t>& high, int64_t value) {
  int64_t seen = high.load(std::memory_order_relaxed);
  while (value > seen && !high.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

size_t padded_bytes(int64_t n) {
  // aligned_alloc wants a size that is a multiple of the alignment.
  const size_t bytes = static_cast<size_t>(n) * sizeof(Scalar);
  const size_t padded = (bytes + Storage::kAlignment - 1) / Storage::kAlignment * Storage::kAlignment;
  return padded == 0 ? Storage::kAlignment : padded;
}
}  // namespace

Storage::Storage(int64_t n) : size_(n), arena_(t_arena) {
  TAPEFORMER_CHECK(n >= 0, "Storage: negative size ", n);
  TAPEFORMER_CHECK(n <= kMaxElements, "Storage: ", n, " elements is more than any machine can hold");
  const size_t padded = padded_bytes(n);
  data_ = static_cast<Scalar*>(cache().take(padded, arena_));
  g_live_count.fetch_add(1, std::memory_order_relaxed);
  g_requested_bytes.fetch_add(static_cast<int64_t>(padded), std::memory_order_relaxed);
  const int64_t bytes = n * static_cast<int64_t>(sizeof(Scalar));
  const int64_t live = g_live_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  raise_to(g_high_water, live);
  if (g_tracking_peak.load(std::memory_order_relaxed)) raise_to(g_peak_bytes, live);
}

std::shared_ptr<Storage> Storage::borrow(Scalar* data, int64_t n) {
  TAPEFORMER_CHECK(data != nullptr || n == 0, "Storage::borrow: no memory for ", n, " floats");
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = data;
  s->size_ = n;
  s->owned_ = false;
  return s;
}

Storage::~Storage() {
  if (!owned_) return;
  cache().give(data_, padded_bytes(size_), arena_);
  g_live_count.fetch_sub(1, std::memory_order_relaxed);
  g_live_bytes.fetch_sub(size_ * static_cast<int64_t>(sizeof(Scalar)), std::memory_order_relaxed);
}

int64_t Storage::live_count() { return g_live_count.load(); }
int64_t Storage::live_bytes() { return g_live_bytes.load(); }
int64_t Storage::peak_bytes() { return g_peak_bytes.load(); }
int64_t Storage::requested_bytes() { return g_requested_bytes.load(); }
int64_t Storage::system_bytes() { return g_system_bytes.load(); }
void Storage::reset_peak() {
  g_peak_bytes.store(g_live_bytes.load());
  g_tracking_peak.store(true);
}
int64_t Storage::cached_bytes() { return static_cast<int64_t>(cache().cached_bytes()); }
void Storage::release_cache() { cache().release(); }

Storage::ArenaScope::ArenaScope(int arena) : previous_(t_arena) {
  TAPEFORMER_CHECK(arena >= 0 && arena < kMaxArenas, "Storage::ArenaScope: arena ", arena, " outside [0, ",
                   kMaxArenas, ")");
  t_arena = arena;
}
Storage::ArenaScope::~ArenaScope() { t_arena = previous_; }

void Storage::keep_freed_memory_mapped() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace tapeformer
