// Memory-lean softmax attention (FlashAttention-style, Dao et al. 2022;
// docs/math.md#softmax-attention): the T x T
// probabilities never exist as a tensor. Per (b, h):
//
//   s_ij = q_i . k_j / sqrt(D) + sum_t bias_t[b, h, i, j]     (-inf where masked)
//   P_ij = softmax_j(s_ij),  P~_ij = P_ij m_ij / (1 - p),  y_i = sum_j P~_ij v_j
//   lse_i = log sum_j e^(s_ij)                                (+inf for a row with no visible key)
//
// Backward, with P recomputed as e^(s - lse) tile by tile:
//   delta_i = dy_i . y_i,  dP_ij = (dy_i . v_j) m_ij / (1 - p),  dS_ij = P_ij (dP_ij - delta_i),
//   dq_i = sum_j dS_ij k_j / sqrt(D),  dk_j = sum_i dS_ij q_i / sqrt(D),  dv_j = sum_i P~_ij dy_i
// (delta_i = sum_j P_ij dP_ij holds with dropout too, because y_i = sum_j P~_ij v_j.)
//
// Causal: query i sits at position Tk - Tq + i and sees keys j <= Tk - Tq + i.
// Dropout: m_ij = [hash_uniform(seed, ((b H + h) Tq + i) Tk + j) >= p], so the
// backward regenerates the mask instead of storing it.
//
// Scores live in 64 x 64 tiles per thread; key tiles wholly in the future
// are skipped and tiles on the causal diagonal are cut into 16-row groups
// that each stop at their last row's last visible key (a masked tile of a
// block-sparse pattern: that span from the first to the last key any row
// of the group sees). Work is parallel over
// (b, h, tile), every output element written by one work item with fixed tile
// boundaries, so results are bit-identical for any thread count.
//
// Causal self-attention on the heads of a packed qkv (B, T, 3C), C = H D,
// into y (B, T, H, D) and lse (B, H, T):
//
//   const int64_t sb = T * 3 * C, st = 3 * C;
//   FlashAttention a{{B, H, T, T, D, D}, {qkv, sb, D, st}, {qkv + C, sb, D, st}, {qkv + 2 * C, sb, D, st},
//                    {}, /*causal=*/true, /*dropout_p=*/0, /*seed=*/0};
//   flash_attention_forward(a, {y, T * C, D, C}, lse);
#pragma once

#include <cstdint>
#include <vector>

#include "tapeformer/core/storage.h"

namespace tapeformer::kernels {

struct FlashAttentionShape {
  int64_t B, H, Tq, Tk, D, Dv;  // q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv)
};

// A (B, H, T, X) operand whose last dim is contiguous: element (b, h, t, x)
// is data[b * sb + h * sh + t * st + x]. Heads of a packed (B, T, 3C) qkv are
// {qkv + h0, T * 3C, D, 3C}.
struct HeadView {
  const Scalar* data;
  int64_t sb, sh, st;
};
struct HeadOut {  // the same for an output; data == nullptr means "not wanted"
  Scalar* data;
  int64_t sb, sh, st;
};

// One additive score term read as (B, H, Tq, Tk) through its strides, with
// stride 0 on broadcast dims (a Tensor::expand view).
struct ScoreBias {
  const Scalar* data;
  int64_t sb, sh, si, sj;
};

// Scores are computed in tiles of kAttentionTile query rows x kAttentionTile keys.
constexpr int64_t kAttentionTile = 64;

// Block sparsity: which (query tile, key tile) pairs are computed at all, and
// within a computed tile which pairs are visible. The pattern is data: a new
// pattern (window, BigBird, ...) is a new list, never a new kernel. Query
// tile t holds rows [64 t, 64 t + 64), key tile u keys [64 u, 64 u + 64).
//
//   BlockSparsity p(Tq, Tk);
//   for each query tile t: for each key tile u it needs, ascending:
//     p.add(u, nullptr);              // every pair of the tile visible
//     p.add(u, mask);                 // mask[r * 64 + c] != 0: row 64 t + r sees key 64 u + c
//   p.end_row();                      // after each query tile, Tq / 64 rounded up times
//   p.finish();                       // the by-key-tile index the backward needs
//
// Masked-out pairs are -inf scores (exactly zero probability and gradient),
// as with a -inf additive bias; causal, bias terms and dropout still apply.
struct BlockSparsity {
  BlockSparsity(int64_t Tq, int64_t Tk);
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

// A learned bias by distance, per head (adaptive attention span's soft mask,
// as log m(d)): query i, at position Tk - Tq + i, and key j get
// data[h * n + d] at d = Tk - Tq + i - j when 0 <= d < n, and -inf otherwise.
// The backward adds sum over b and the pairs at distance d of dS to
// grad[h * n + d] (partial sums per query tile, added in a fixed order).
struct DistanceBias {
  const Scalar* data;  // (H, n)
  int64_t n;
  Scalar* grad;  // (H, n) accumulated into, or null
};

struct FlashAttention {
  FlashAttentionShape s;
  HeadView q, k, v;             // (B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, Dv)
  std::vector<ScoreBias> bias;  // summed in this order, then added to the scaled score
  bool causal;
  Scalar dropout_p;  // in [0, 1)
  uint64_t seed;     // of the dropout mask; unused when dropout_p == 0
  const BlockSparsity* sparsity = nullptr;  // null: every tile (dense); else its (Tq, Tk) must be s's
  const DistanceBias* distance_bias = nullptr;  // added to the scaled score after `bias`
  // Rows in an order other than their positions (LSH attention's buckets):
  // q_pos (B H, Tq) and k_pos (B H, Tk) give each row's position; a key
  // after the query's position is masked (-inf). With self_row (B H, Tq: the
  // key row at the query's own position, or -1) the query does not see that
  // key, unless it sees nothing else: then y_i = v_self and lse_i =
  // kSelfScore exactly (Reformer's finite self mask, without its rounding:
  // the self pair's score is a constant, so it gives v a gradient and q, k none).
  // Use with causal = false (causal compares rows).
  const int32_t* q_pos = nullptr;
  const int32_t* k_pos = nullptr;
  const int32_t* self_row = nullptr;
};

inline constexpr Scalar kSelfScore = -1e5f;  // the lse of a query that sees only itself

// y (B, H, Tq, Dv) and lse (B, H, Tq, contiguous). A row with no visible key
// gets y_i = 0 and lse_i = +inf, so the recomputed P (and every gradient) is 0.
void flash_attention_forward(const FlashAttention& a, HeadOut y, Scalar* lse);

// Given the forward's y (B, H, Tq, Dv), lse (B, H, Tq) and dy (B, H, Tq, Dv),
// writes dq (B, H, Tq, D), dk (B, H, Tk, D), dv (B, H, Tk, Dv); a null
// output is skipped. One pass over (b, h, query tile) for dq, one over
// (b, h, key tile) for dk and dv; with a single query tile (Tq <= 64) one
// pass over (b, h) does all three, with the same sums in the same order.
// dlse (B, H, Tq), or null: the gradient of the loss with respect to lse
// too (when lse is an output that is used, as when LSH rounds are combined):
// dS_ij = P_ij (dP_ij - delta_i + dlse_i).
void flash_attention_backward(const FlashAttention& a, HeadView y, const Scalar* lse, HeadView dy, HeadOut dq,
                              HeadOut dk, HeadOut dv, const Scalar* dlse = nullptr);

}  // namespace tapeformer::kernels
