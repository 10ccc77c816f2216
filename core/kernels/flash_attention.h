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

#include "tapeformer/core/kernels/block_sparsity.h"
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

// The terms a kind adds to every query row's scores, prepared once per call
// and per (b, h), and applied by one routine in the forward and in the
// backward's recompute (so both see the same scores, bit for bit):
struct RowTerms {
  std::vector<ScoreBias> bias;  // summed in this order, then added to the scaled score (ALiBi, TXL, masks)
  const DistanceBias* distance = nullptr;  // added after `bias` (adaptive span)
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

struct FlashAttention {
  FlashAttentionShape s;
  HeadView q, k, v;  // (B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, Dv)
  RowTerms terms;    // score terms, distance bias, row positions
  bool causal;
  Scalar dropout_p;  // in [0, 1)
  uint64_t seed;     // of the dropout mask; unused when dropout_p == 0
  const BlockSparsity* sparsity = nullptr;  // null: every tile (dense); else its (Tq, Tk) must be s's
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
