#include "tapeformer/layers/attention/tile_cache.h"

namespace tapeformer {

std::shared_ptr<const kernels::BlockMask> TileCache::get(
    const Key& key, const std::function<std::shared_ptr<const kernels::BlockMask>()>& build) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (const auto it = tiles_.find(key); it != tiles_.end()) return it->second;
  if (tiles_.size() >= 64) tiles_.clear();
  return tiles_[key] = build();
}

}  // namespace tapeformer
