// Linear-attention kernels (docs/math.md#linear-attention): the causal product, kernelised linear
// attention with its normaliser, Shen et al.'s efficient attention, and the
// recurrent (RNN) forms used for generation.
//
//   kernels::LinearAttentionShape s{B * H, T, C, M};
//   kernels::linear_attention_forward(a, b, v, y, den, /*causal=*/true, 1e-6f, s);
//   kernels::linear_attention_backward(a, b, v, y, den, dy, da, db, dv, true, s);
//
// Every buffer is contiguous, (b, h) slices first: a, b, q, k are (BH, T, C),
// v, y and their gradients (BH, T, M). Work is parallel over the BH slices and
// each slice is computed by one thread in a fixed order, so results do not
// depend on the thread count.
//
// The causal kernels never hold a T x T or a T x C x M tensor. The chunked
// form (docs/math.md#chunked-form) cuts the sequence into chunks of 64 positions: inside a
// chunk a masked 64 x 64 product, across chunks a running C x M state, all
// through the packet GEMM. Extra memory is O(C M) plus chunk-sized buffers per
// thread (efficient attention's backward adds O(T C), see below).
#pragma once

#include <cstdint>

#include "tapeformer/core/storage.h"

namespace tapeformer::kernels {

// BH independent (batch, head) slices of T positions with C feature columns
// (a, b or q, k) and M value columns (v, y).
struct LinearAttentionShape {
  int64_t BH, T, C, M;
};

// ---- causal product (docs/math.md#backward-of-the-causal-product) ----------
// y_i = sum_{j<=i} (a_i . b_j) v_j, i.e. y_i = a_i^T S_i with S_i = sum_{j<=i} b_j v_j^T.
void causal_product_forward(const Scalar* a,  // (BH, T, C)
                            const Scalar* b,  // (BH, T, C)
                            const Scalar* v,  // (BH, T, M)
                            Scalar* y,        // (BH, T, M)
                            const LinearAttentionShape& s);
// Given dy = g, writes da_i = S_i g_i, db_j = R_j v_j, dv_j = R_j^T b_j with
// R_j = sum_{i>=j} a_i g_i^T: a pass forward over the chunks (S) and one
// backward (R).
void causal_product_backward(const Scalar* a, const Scalar* b, const Scalar* v,  // as in the forward
                             const Scalar* dy,                                   // (BH, T, M)
                             Scalar* da, Scalar* db,                             // (BH, T, C)
                             Scalar* dv,                                         // (BH, T, M)
                             const LinearAttentionShape& s);

// ---- linear attention (docs/math.md#backward-with-the-normaliser) ------------
// y_i = a_i^T S_i / den_i, den_i = a_i . z_i + eps, z_i = sum_{j<=i} b_j (causal) or
// S, z summed over all j (non-causal). It is the causal product with the value
// column 1 appended (v~ = [v, 1]); that column is carried as the vector z.
void linear_attention_forward(const Scalar* a,  // (BH, T, C), > 0
                              const Scalar* b,  // (BH, T, C), > 0
                              const Scalar* v,  // (BH, T, M)
                              Scalar* y,        // (BH, T, M)
                              Scalar* den,      // (BH, T): saved for the backward
                              bool causal, Scalar eps, const LinearAttentionShape& s);
// With g^_i = dy_i / den_i and gam_i = -(dy_i . y_i) / den_i (the gradient of the
// value column 1), the causal-product backward with g~ = [g^, gam]:
//   da_i = S_i g^_i + gam_i z_i, db_j = R_j v_j + r_j, dv_j = R_j^T b_j,
//   R_j = sum_{i>=j} a_i g^_i^T, r_j = sum_{i>=j} gam_i a_i (sums over all i, j when non-causal).
void linear_attention_backward(const Scalar* a, const Scalar* b, const Scalar* v,  // as in the forward
                               const Scalar* y,                                    // (BH, T, M), the forward's
                               const Scalar* den,                                  // (BH, T), the forward's
                               const Scalar* dy,                                   // (BH, T, M)
                               Scalar* da, Scalar* db,                             // (BH, T, C)
                               Scalar* dv,                                         // (BH, T, M)
                               bool causal, const LinearAttentionShape& s);

// ---- efficient attention, causal (docs/math.md#efficient-attention) -------------
// y_i = sum_d al_id U_i[d] / u_i[d], al_i = softmax(q_i), U_i[d] = sum_{j<=i} e^{k_jd} v_j,
// u_i[d] = sum_{j<=i} e^{k_jd}: efficient_attention_recurrent from an empty state.
void efficient_attention_causal_forward(const Scalar* q,  // (BH, T, C)
                                        const Scalar* k,  // (BH, T, C)
                                        const Scalar* v,  // (BH, T, M)
                                        Scalar* y,        // (BH, T, M)
                                        const LinearAttentionShape& s);
// With rho_id = dy_i . U_i[d] / u_i[d], m_jd the running max of k_.d up to j and
// u~_jd = u_j[d] e^{-m_jd}:
//   dq_i = al_i (rho_i - al_i . rho_i),
//   dv_j = sum_d e^{k_jd - m_jd} R_j[d], dk_jd = e^{k_jd - m_jd} (v_j . R_j[d] - r_j[d]),
//   R_j[d] = (al_jd / u~_jd) dy_j + e^{m_jd - m_{j+1,d}} R_{j+1}[d],
//   r_j[d] = (al_jd / u~_jd) rho_jd + e^{m_jd - m_{j+1,d}} r_{j+1}[d].
// Pass 1 (j up) rebuilds the running sums and keeps rho, m and al / u~ (T x C
// each); pass 2 (j down) runs the recurrences, whose factors are all <= 1.
// Extra memory O(T C + C M) per thread.
void efficient_attention_causal_backward(const Scalar* q, const Scalar* k, const Scalar* v,  // as in the forward
                                         const Scalar* dy,                                   // (BH, T, M)
                                         Scalar* dq, Scalar* dk,                             // (BH, T, C)
                                         Scalar* dv,                                         // (BH, T, M)
                                         const LinearAttentionShape& s);

// ---- recurrent forms for generation (state updated in place) --------------------
// Causal linear attention as an RNN (docs/math.md#rnn-form), for t in [0, T):
//   S += b_t v_t^T, z += bz_t, y_t = (a_t^T S) / (az_t . z + eps)
// (a, b) enter the numerator and (az, bz) the denominator: the same features,
// except that RoPE rotates the numerator's only (Su et al. 2021 §3.3).
// S (BH, C, M), z (BH, C); a, b, az, bz (BH, T, C); v (BH, T, M); y (BH, T, M).
void linear_attention_recurrent(Scalar* S, Scalar* z, const Scalar* a, const Scalar* b, const Scalar* az,
                                const Scalar* bz, const Scalar* v, Scalar* y, int64_t BH, int64_t T, int64_t C,
                                int64_t M, Scalar eps);
// Efficient attention's causal recurrence (docs/math.md#efficient-attention), per feature d a
// running max m[d] (init -inf),
// U[d, :] = sum_j e^{k_jd - m_d} v_j, u[d] = sum_j e^{k_jd - m_d}; y_t = sum_d softmax(q_t)_d U[d, :] / u[d].
// U (BH, C, M), u (BH, C), m (BH, C); q, k (BH, T, C); v (BH, T, M); y (BH, T, M).
void efficient_attention_recurrent(Scalar* U, Scalar* u, Scalar* m, const Scalar* q, const Scalar* k,
                                   const Scalar* v, Scalar* y, int64_t BH, int64_t T, int64_t C, int64_t M);

}  // namespace tapeformer::kernels
