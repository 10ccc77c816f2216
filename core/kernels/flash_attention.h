// Memory-lean softmax attention (FlashAttention-style, Dao et al. 2022;
// docs/math.md#softmax-attention): the T x T
// probabilities never exist as a tensor. Per (b, h):
//
//   s_ij = maps( q_i . k_j / sqrt(D) + sum_t term_t(b, h, i, j) )   (-inf where masked)
//   P_ij = softmax_j(s_ij),  P~_ij = P_ij m_ij / (1 - p),  y_i = sum_j P~_ij v_j
//   lse_i = log sum_j e^(s_ij)                                (+inf for a row with no visible key)
//
// The terms, maps and masks are the call's modifiers (score_mods.h): a kind
// supplies its own and the kernel applies them, one routine for the forward
// and the backward's recompute, so both see the same scores bit for bit.
// Backward, with P recomputed as e^(s - lse) tile by tile:
//   delta_i = dy_i . y_i,  dP_ij = (dy_i . v_j) m_ij / (1 - p),  dS_ij = P_ij (dP_ij - delta_i),
//   dq_i = sum_j dS_ij k_j / sqrt(D),  dk_j = sum_i dS_ij q_i / sqrt(D),  dv_j = sum_i P~_ij dy_i
// (delta_i = sum_j P_ij dP_ij holds with dropout too, because y_i = sum_j P~_ij v_j),
// with dS taken back through the maps, and a learned modifier's gradient
// summed from dS.
//
// Causal: query i sits at position Tk - Tq + i and sees keys j <= Tk - Tq + i.
// Dropout: m_ij = [hash_uniform(seed, ((b H + h) Tq + i) Tk + j) >= p], so the
// backward regenerates the mask instead of storing it.
//
// Scores live in 64 x 64 tiles per thread; only the tiles the block mask
// names are computed (all, without one), key tiles wholly in the future are
// skipped, and tiles on the causal diagonal (or partial tiles of the block
// mask) are cut into 16-row groups that each stop at the last key they see.
// Work is parallel over (b, h, tile), every output element written by one
// work item with fixed tile boundaries, so results are bit-identical for any
// thread count.
//
// Causal self-attention on the heads of a packed qkv (B, T, 3C), C = H D,
// into y (B, T, H, D) and lse (B, H, T):
//
//   const int64_t sb = T * 3 * C, st = 3 * C;
//   FlashAttention a;
//   a.s = {B, H, T, T, D, D};
//   a.q = {qkv, sb, D, st}, a.k = {qkv + C, sb, D, st}, a.v = {qkv + 2 * C, sb, D, st};
//   flash_attention_forward(a, {y, T * C, D, C}, lse);
#pragma once

#include <cstdint>
#include <vector>

#include "tapeformer/core/kernels/block_mask.h"
#include "tapeformer/core/kernels/score_mods.h"
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

// Where the call's heads and rows sit in the attention they are part of, so
// that modifiers see that attention's coordinates (ScoreRow): the call's head
// c is head h0 + c; or, with period l > 0, the call's head c is residue class
// c0 + c of head h0, its row r the position c0 + c + l r (of Tq = Tk positions).
struct Placement {
  int64_t h0 = 0, c0 = 0, period = 0;
  int64_t Tq = -1, Tk = -1;  // the attention's lengths; -1: the call's own
};

struct FlashAttention {
  FlashAttentionShape s{};
  HeadView q{}, k{}, v{};  // (B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, Dv)
  bool causal = true;
  Scalar dropout_p = 0;  // in [0, 1)
  uint64_t seed = 0;     // of the dropout mask; unused when dropout_p == 0
  const BlockMask* blocks = nullptr;  // the tiles computed (null: every tile); its (Tq, Tk) must be s's
  ScoreMods mods;                     // terms, maps and masks (score_mods.h)
  Placement place;
};

// y (B, H, Tq, Dv) and lse (B, H, Tq, contiguous). A row with no visible key
// gets y_i = 0 and lse_i = +inf, so the recomputed P (and every gradient) is
// 0, or its mask's fallback key (ScoreMask::fallback).
void flash_attention_forward(const FlashAttention& a, HeadOut y, Scalar* lse);

// Given the forward's y (B, H, Tq, Dv), lse (B, H, Tq) and dy (B, H, Tq, Dv),
// writes dq (B, H, Tq, D), dk (B, H, Tk, D), dv (B, H, Tk, Dv); a null
// output is skipped. One pass over (b, h, query tile) for dq, one over
// (b, h, key tile) for dk and dv; with a single query tile (Tq <= 64) one
// pass over (b, h) does all three, with the same sums in the same order.
// dlse (B, H, Tq), or null: the gradient of the loss with respect to lse
// too (when lse is an output that is used, e.g. to weigh several calls by
// their lse): dS_ij = P_ij (dP_ij - delta_i + dlse_i). The learned
// modifiers' gradients are added to a.mods.grads.
void flash_attention_backward(const FlashAttention& a, HeadView y, const Scalar* lse, HeadView dy, HeadOut dq,
                              HeadOut dk, HeadOut dv, const Scalar* dlse = nullptr);

}  // namespace tapeformer::kernels
