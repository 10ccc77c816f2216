// Causal linear attention on log-features, with streaming stabilisers: the
// kernel of Performer's FAVOR+ (Choromanski et al. 2020; docs/math.md#favor), where the features are
// e^(w_r . x' - |x'|^2 / 2) and would overflow float as plain numbers.
//
//   y_i = sum_r e^(a_ir) S_ir / sum_r e^(a_ir) z_ir,   S_ir = sum_{j<=i} e^(b_jr) v_j,  z_ir = sum_{j<=i} e^(b_jr)
//
// a, b are the log-features (BH, T, R) of queries and keys, v and y (BH, T, M).
// The state per (b, h) is kept scaled by the running max c_r = max_{j<=i} b_jr
// (S~ = S e^-c, z~ = z e^-c: rescaled when the max grows, never a
// whole-sequence max), and each query row by M_i = max_r (a_ir + c_r): every
// exponent the kernel takes is <= 0. y_i = sum_{j<=i} sum_r P_ijr v_j with
// P_ijr = e^(b_jr + a_ir - L_i) a distribution over (j, r), L_i = M_i + log(sum_r e^(a_ir + c_r - M_i) z~_r).
//
// Backward (g = dy; the stabilisers cancel, so no gradient flows through them):
//   da_ir = e^(a_ir + c_r(i) - L_i) (S~_r(i) . g_i - (g_i . y_i) z~_r(i))
//   db_jr = sum_{i>=j} P_ijr (g_i . v_j - g_i . y_i),   dv_j = sum_{i>=j} sum_r P_ijr g_i
// the last two by a reverse scan keeping sum_{i>=j} e^(a_ir - L_i) g_i and (g_i . y_i) e^(a_ir - L_i)
// scaled by their own running max, so again every exponent is <= 0.
// Per (b, h) one thread scans in a fixed order: results do not depend on the thread count.
// A position costs a few packet passes over the (R, M) state: the row's
// exponentials at once, the max's rescale folded into the update
// (S~ <- e^(c_old - c_new) S~ + e^(b - c_new) v^T), every loop in packets
// from index 0 (vector_loops.h), so neither do they depend on where buffers lie.
#pragma once

#include <cstdint>

#include "tapeformer/core/storage.h"

namespace tapeformer::kernels {

struct FavorShape {
  int64_t BH, T, R, M;  // slices, positions, features, value columns
};

// From the state (S~ (BH, R, M), z~ (BH, R), c (BH, R); an empty state is
// zeros with c = -inf) through T more positions: y (BH, T, M) and, when not
// null, L (BH, T). The state is left after the last position (generation).
void favor_scan(Scalar* S, Scalar* z, Scalar* c, const Scalar* a, const Scalar* b, const Scalar* v, Scalar* y, Scalar* L,
                const FavorShape& s);

// The causal forward from an empty state: y (BH, T, M), L (BH, T).
void favor_forward(const Scalar* a, const Scalar* b, const Scalar* v, Scalar* y, Scalar* L, const FavorShape& s);

// Given the forward's y and L and dy: da, db (BH, T, R), dv (BH, T, M); a null output is skipped.
void favor_backward(const Scalar* a, const Scalar* b, const Scalar* v, const Scalar* y, const Scalar* L,
                    const Scalar* dy, Scalar* da, Scalar* db, Scalar* dv, const FavorShape& s);

}  // namespace tapeformer::kernels
