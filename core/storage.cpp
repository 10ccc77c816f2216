#include "core/storage.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include "core/error.h"

namespace tapeformer {
namespace {
std::atomic<int64_t> g_live_count{0};
std::atomic<int64_t> g_live_bytes{0};
}  // namespace

Storage::Storage(int64_t n) : size_(n) {
  TAPEFORMER_CHECK(n >= 0, "Storage: negative size ", n);
  // aligned_alloc wants a size that is a multiple of the alignment.
  size_t bytes = static_cast<size_t>(n) * sizeof(Scalar);
  size_t padded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (padded == 0) padded = kAlignment;
  data_ = static_cast<Scalar*>(std::aligned_alloc(kAlignment, padded));
  if (!data_) throw std::bad_alloc();
  g_live_count.fetch_add(1, std::memory_order_relaxed);
  g_live_bytes.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
}

Storage::~Storage() {
  std::free(data_);
  g_live_count.fetch_sub(1, std::memory_order_relaxed);
  g_live_bytes.fetch_sub(size_ * static_cast<int64_t>(sizeof(Scalar)), std::memory_order_relaxed);
}

int64_t Storage::live_count() { return g_live_count.load(); }
int64_t Storage::live_bytes() { return g_live_bytes.load(); }

}  // namespace tapeformer
