#include "core/storage.h"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace tapeformer {
namespace {
std::atomic<int64_t> g_live_count{0};
std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_peak_bytes{-1};
std::atomic<bool> g_tracking_peak{false};  // set by the first reset_peak()

// A training step allocates the same buffer sizes every iteration. Keeping
// freed blocks by exact size avoids returning them to the OS and faulting the
// pages in again next step (this was ~20% of a step's time).
class BlockCache {
 public:
  static constexpr size_t kMaxCachedBytes = size_t{1} << 30;

  void* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= bytes;
        return p;
      }
    }
    void* p = std::aligned_alloc(Storage::kAlignment, bytes);
    if (!p) {
      release();  // give cached memory back and retry once
      p = std::aligned_alloc(Storage::kAlignment, bytes);
      if (!p) throw std::bad_alloc();
    }
    return p;
  }

  void give(void* p, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + bytes <= kMaxCachedBytes) {
        free_[bytes].push_back(p);
        cached_ += bytes;
        return;
      }
    }
    std::free(p);
  }

  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [bytes, blocks] : free_)
      for (void* p : blocks) std::free(p);
    free_.clear();
    cached_ = 0;
  }

  size_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }

 private:
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};

BlockCache& cache() {
  static BlockCache* c = new BlockCache();  // never destroyed: storages may outlive statics
  return *c;
}

size_t padded_bytes(int64_t n) {
  // aligned_alloc wants a size that is a multiple of the alignment.
  const size_t bytes = static_cast<size_t>(n) * sizeof(Scalar);
  const size_t padded = (bytes + Storage::kAlignment - 1) / Storage::kAlignment * Storage::kAlignment;
  return padded == 0 ? Storage::kAlignment : padded;
}
}  // namespace

Storage::Storage(int64_t n) : size_(n) {
  TAPEFORMER_CHECK(n >= 0, "Storage: negative size ", n);
  TAPEFORMER_CHECK(n <= kMaxElements, "Storage: ", n, " elements is more than any machine can hold");
  data_ = static_cast<Scalar*>(cache().take(padded_bytes(n)));
  g_live_count.fetch_add(1, std::memory_order_relaxed);
  const int64_t bytes = n * static_cast<int64_t>(sizeof(Scalar));
  const int64_t live = g_live_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (g_tracking_peak.load(std::memory_order_relaxed)) {
    int64_t peak = g_peak_bytes.load(std::memory_order_relaxed);
    while (live > peak && !g_peak_bytes.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
  }
}

Storage::~Storage() {
  cache().give(data_, padded_bytes(size_));
  g_live_count.fetch_sub(1, std::memory_order_relaxed);
  g_live_bytes.fetch_sub(size_ * static_cast<int64_t>(sizeof(Scalar)), std::memory_order_relaxed);
}

int64_t Storage::live_count() { return g_live_count.load(); }
int64_t Storage::live_bytes() { return g_live_bytes.load(); }
int64_t Storage::peak_bytes() { return g_peak_bytes.load(); }
void Storage::reset_peak() {
  g_peak_bytes.store(g_live_bytes.load());
  g_tracking_peak.store(true);
}
int64_t Storage::cached_bytes() { return static_cast<int64_t>(cache().cached_bytes()); }
void Storage::release_cache() { cache().release(); }

void Storage::keep_freed_memory_mapped() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace tapeformer
