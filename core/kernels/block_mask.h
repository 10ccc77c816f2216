// The block mask of the attention kernel (flash_attention.h; FlexAttention's
// BlockMask): which (query tile, key tile) pairs are computed at all, and
// inside a computed tile which pairs are visible. The sparse attention kinds
// (layers/attention/sparse.h) and LSH's chunks build one per pattern and
// length, and the tile cache (layers/attention/tile_cache.h) keeps them.
#pragma once

#include <cstdint>
#include <vector>

namespace tapeformer::kernels {

// Scores are computed in tiles of kAttentionTile query rows x kAttentionTile keys.
constexpr int64_t kAttentionTile = 64;

// Which (query tile, key tile) pairs are computed at all, and
// within a computed tile which pairs are visible. The pattern is data: a new
// pattern (window, BigBird, ...) is a new list, never a new kernel. Query
// tile t holds rows [64 t, 64 t + 64), key tile u keys [64 u, 64 u + 64).
//
//   BlockMask p(Tq, Tk);
//   for each query tile t: for each key tile u it needs, ascending:
//     p.add(u, nullptr);              // every pair of the tile visible
//     p.add(u, mask);                 // mask[r * 64 + c] != 0: row 64 t + r sees key 64 u + c
//   p.end_row();                      // after each query tile, Tq / 64 rounded up times
//   p.finish();                       // the by-key-tile index the backward needs
//
// Masked-out pairs are -inf scores (exactly zero probability and gradient),
// as with a -inf additive bias; causal, bias terms and dropout still apply.
struct BlockMask {
  BlockMask(int64_t Tq, int64_t Tk);
  void add(int32_t key_tile, const uint8_t* mask);
  void end_row();
  void finish();
  int64_t q_tiles() const { return (Tq + kAttentionTile - 1) / kAttentionTile; }
  int64_t k_tiles() const { return (Tk + kAttentionTile - 1) / kAttentionTile; }
  int64_t tiles() const { return static_cast<int64_t>(key_tile.size()); }  // computed tile pairs

  int64_t Tq, Tk;
  std::vector<int64_t> row_start{0};   // CSR: entries row_start[t] .. row_start[t + 1] of query tile t
  std::vector<int32_t> key_tile;       // per entry, ascending within a row
  std::vector<int32_t> mask_of;        // per entry: its mask's index in masks, or -1 (all visible)
  std::vector<int16_t> col_lo, col_hi;  // per entry: the columns some row sees, [lo, hi); only they are computed
  std::vector<uint8_t> masks;          // 64 x 64 bytes per masked entry
  std::vector<int64_t> col_start;      // CSC (finish()): entries of key tile u, by ascending query tile,
  std::vector<int32_t> col_entry;      //   are col_entry[col_start[u] .. col_start[u + 1])
  int64_t pairs = 0;                   // visible pairs listed, for reports
};

}  // namespace tapeformer::kernels
