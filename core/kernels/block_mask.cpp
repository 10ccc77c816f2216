#include "tapeformer/core/kernels/block_mask.h"

#include <algorithm>

#include "tapeformer/core/error.h"

namespace tapeformer::kernels {

BlockMask::BlockMask(int64_t Tq_, int64_t Tk_) : Tq(Tq_), Tk(Tk_) {
  TAPEFORMER_CHECK(Tq > 0 && Tk > 0, "BlockMask: Tq and Tk must be positive, got ", Tq, ", ", Tk);
}

void BlockMask::add(int32_t u, const uint8_t* mask) {
  const int64_t t = static_cast<int64_t>(row_start.size()) - 1;
  TAPEFORMER_CHECK(t < q_tiles(), "BlockMask::add: all ", q_tiles(), " query tiles have ended");
  TAPEFORMER_CHECK(u >= 0 && u < k_tiles(), "BlockMask::add: key tile ", u, " is outside [0, ", k_tiles(), ")");
  TAPEFORMER_CHECK(static_cast<int64_t>(key_tile.size()) == row_start.back() || key_tile.back() < u,
                   "BlockMask::add: key tiles of a query tile must ascend (", u, " after ", key_tile.back(), ")");
  const int64_t rows = std::min(kAttentionTile, Tq - t * kAttentionTile), cols = std::min(kAttentionTile, Tk - int64_t{u} * kAttentionTile);
  key_tile.push_back(u);
  if (mask == nullptr) {
    mask_of.push_back(-1);
    col_lo.push_back(0);
    col_hi.push_back(static_cast<int16_t>(cols));
    pairs += rows * cols;
    return;
  }
  mask_of.push_back(static_cast<int32_t>(masks.size() / (kAttentionTile * kAttentionTile)));
  masks.insert(masks.end(), mask, mask + kAttentionTile * kAttentionTile);
  int64_t lo = cols, hi = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (mask[r * kAttentionTile + c] != 0) ++pairs, lo = std::min(lo, c), hi = std::max(hi, c + 1);
  if (hi == 0) lo = 0;  // nothing visible: an empty span
  col_lo.push_back(static_cast<int16_t>(lo));
  col_hi.push_back(static_cast<int16_t>(hi));
}

void BlockMask::end_row() {
  TAPEFORMER_CHECK(static_cast<int64_t>(row_start.size()) - 1 < q_tiles(), "BlockMask::end_row: all ",
                   q_tiles(), " query tiles have ended");
  row_start.push_back(static_cast<int64_t>(key_tile.size()));
}

void BlockMask::finish() {
  TAPEFORMER_CHECK(static_cast<int64_t>(row_start.size()) - 1 == q_tiles(), "BlockMask::finish: ",
                   row_start.size() - 1, " of ", q_tiles(), " query tiles ended");
  col_start.assign(static_cast<size_t>(k_tiles() + 1), 0);
  for (int32_t u : key_tile) ++col_start[u + 1];
  for (int64_t u = 0; u < k_tiles(); ++u) col_start[u + 1] += col_start[u];
  col_entry.assign(key_tile.size(), 0);
  std::vector<int64_t> next(col_start.begin(), col_start.end() - 1);
  for (size_t e = 0; e < key_tile.size(); ++e) col_entry[next[key_tile[e]]++] = static_cast<int32_t>(e);  // rows ascend
}

}  // namespace tapeformer::kernels
