// TileCache: the block-sparse kernel's tiles (core/kernels/block_mask.h)
// of a layer's patterns, built once per shape and offsets and kept. The
// sparse kinds, adaptive span and LSH each hold one.
//
//   const auto tiles = cache.get({T, chunk, 0, 0, 0}, [&] { return tile_pattern(ChunkLocal(chunk), T, T, 0, 0); });
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "tapeformer/core/kernels/block_mask.h"

namespace tapeformer {

// Tiles built once per key and kept (a layer's patterns by shape); safe
// for data-parallel shards running one layer at once. Past 64 entries the
// table starts over: generation moves the offsets on every token.
class TileCache {
 public:
  using Key = std::array<int64_t, 5>;
  std::shared_ptr<const kernels::BlockMask> get(
      const Key& key, const std::function<std::shared_ptr<const kernels::BlockMask>()>& build) const;
  // Through `cache`, or built afresh when it is null (a free function's caller without a layer).
  static std::shared_ptr<const kernels::BlockMask> get(
      const TileCache* cache, const Key& key,
      const std::function<std::shared_ptr<const kernels::BlockMask>()>& build) {
    return cache != nullptr ? cache->get(key, build) : build();
  }

 private:
  mutable std::mutex mutex_;
  mutable std::map<Key, std::shared_ptr<const kernels::BlockMask>> tiles_;
};

}  // namespace tapeformer
