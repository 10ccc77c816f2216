// Storage: a 64-byte-aligned float32 buffer shared by tensors and their views.
//
// Live storages and bytes are counted process-wide so tests can prove that
// saved tensors are released (see `Storage::live_count()`).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tapeformer {

using Scalar = float;  // the one compute type (STYLE rule 10)

class Storage {
 public:
  static constexpr size_t kAlignment = 64;

  // Uninitialised buffer of n floats (n may be 0).
  explicit Storage(int64_t n);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Scalar* data() { return data_; }
  const Scalar* data() const { return data_; }
  int64_t size() const { return size_; }

  // Number of Storage objects alive in the process, and their total bytes.
  static int64_t live_count();
  static int64_t live_bytes();

 private:
  Scalar* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace tapeformer
