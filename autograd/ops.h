// The op catalogue: every differentiable op in tapeformer, one line of math each.
//
// Each op computes its result and, when an input requires grad and recording
// is on, records its backward closure on the current tape. Forward and
// backward live together in one family file under autograd/ops/. Binary ops
// broadcast with numpy's size-1 rule through an explicit `expand`, whose
// backward is `sum_to`. Shapes are checked; mistakes throw tapeformer::Error
// naming the op and the shapes.
//
// Shape vocabulary: B batch, T time, C channels, H heads, D head dim, V vocab.
#pragma once

#include <memory>
#include <vector>

#include "tapeformer/autograd/tape.h"
#include "tapeformer/autograd/var.h"
#include "tapeformer/core/kernels/activation.h"
#include "tapeformer/core/kernels/flash_attention.h"
#include "tapeformer/core/rng.h"

namespace tapeformer {

// ---- elementwise (autograd/ops/elementwise.cpp) ---------------------------
Var add(const Var& a, const Var& b);        // a + b            da = g, db = g (summed to shape)
Var sub(const Var& a, const Var& b);        // a - b            da = g, db = -g
Var mul(const Var& a, const Var& b);        // a * b            da = g b, db = g a
Var div(const Var& a, const Var& b);        // a / b            da = g / b, db = -g a / b^2
Var neg(const Var& x);                      // -x               dx = -g
Var add_scalar(const Var& x, Scalar s);     // x + s            dx = g
Var mul_scalar(const Var& x, Scalar s);     // x * s            dx = g s
Var exp(const Var& x);                      // e^x              dx = g y
Var log(const Var& x);                      // ln x             dx = g / x
Var sqrt(const Var& x);                     // x^(1/2)          dx = g / (2 y)
Var pow(const Var& x, Scalar p);            // x^p              dx = g p x^(p-1)
Var tanh(const Var& x);                     // tanh x           dx = g (1 - y^2)
Var sigmoid(const Var& x);                  // 1 / (1 + e^-x)   dx = g y (1 - y)
Var relu(const Var& x);                     // max(x, 0)        dx = g [x > 0]
// 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi) (GPT-2's tanh approximation)
//                                           dx = g (0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 * 0.044715 x^2))
Var gelu(const Var& x);
Var silu(const Var& x);                     // x sigmoid(x) (swish)   dx = g s (1 + x (1 - s)), s = sigmoid(x)
Var elu(const Var& x, Scalar alpha = 1);    // x > 0 ? x : a (e^x - 1)   dx = g (x > 0 ? 1 : y + a)
// cond != 0 ? a : b (cond, a, b broadcast together)   da = g cond, db = g (1 - cond)
Var where(const Tensor& cond, const Var& a, const Var& b);
// mask != 0 ? value : x (mask broadcasts to x)       dx = g (1 - mask)
Var masked_fill(const Var& x, const Tensor& mask, Scalar value);
// x * m / (1 - p), m ~ Bernoulli(1 - p)   dx = g m / (1 - p); identity when p == 0. m comes from one
// draw of rng and each element's index (counter-based, core/rng.h hash_uniform): the backward
// regenerates it, so no mask is stored.
Var dropout(const Var& x, Scalar p, Rng& rng);
// Broadcast view to `shape` (numpy rules)             dx = sum_to(g, x.shape)
Var expand(const Var& x, const Shape& shape);
// Sum over broadcast dims down to `shape`             dx = expand(g, x.shape)
Var sum_to(const Var& x, const Shape& shape);

// Operators for readable formulas.
inline Var operator+(const Var& a, const Var& b) { return add(a, b); }
inline Var operator-(const Var& a, const Var& b) { return sub(a, b); }
inline Var operator*(const Var& a, const Var& b) { return mul(a, b); }
inline Var operator/(const Var& a, const Var& b) { return div(a, b); }
inline Var operator-(const Var& x) { return neg(x); }
inline Var operator+(const Var& x, Scalar s) { return add_scalar(x, s); }
inline Var operator+(Scalar s, const Var& x) { return add_scalar(x, s); }
inline Var operator-(const Var& x, Scalar s) { return add_scalar(x, -s); }
inline Var operator-(Scalar s, const Var& x) { return add_scalar(neg(x), s); }
inline Var operator*(const Var& x, Scalar s) { return mul_scalar(x, s); }
inline Var operator*(Scalar s, const Var& x) { return mul_scalar(x, s); }
inline Var operator/(const Var& x, Scalar s) { return mul_scalar(x, 1 / s); }
inline Var operator/(Scalar s, const Var& x) { return mul_scalar(pow(x, -1), s); }

// ---- reductions (autograd/ops/reduce.cpp) ----------------------------------
// Sum over `axes` (negative allowed)                    dx = expand(g, x.shape)
Var sum(const Var& x, const std::vector<int>& axes, bool keepdim = false);
Var sum(const Var& x);                                  // all elements -> [] (rank 0)
// Mean over `axes`                                      dx = expand(g, x.shape) / n
Var mean(const Var& x, const std::vector<int>& axes, bool keepdim = false);
Var mean(const Var& x);
// Max over one axis; ties go to the first maximum      dx = g at the argmax, 0 elsewhere
Var max(const Var& x, int axis, bool keepdim = false);
// Max over several axes (one axis at a time)
Var max(const Var& x, const std::vector<int>& axes, bool keepdim = false);
// Inclusive cumulative sum along axis                  dx = reverse cumsum of g
Var cumsum(const Var& x, int axis);

// ---- shape (autograd/ops/shape.cpp) -----------------------------------------
Var reshape(const Var& x, const Shape& shape);          // view when contiguous    dx = reshape(g, x.shape)
Var transpose(const Var& x, int a, int b);              // swap two axes (view)    dx = transpose(g, a, b)
Var permute(const Var& x, const std::vector<int>& order);  // view                 dx = permute(g, inverse)
Var slice(const Var& x, int axis, int64_t start, int64_t end);  // [start, end) view  dx = g padded with 0
Var concat(const std::vector<Var>& xs, int axis);       // join along axis         dx_i = slice of g
std::vector<Var> split(const Var& x, const std::vector<int64_t>& sizes, int axis);  // dx = concat(g_i)
// A packed projection qkv (B, T, 3C), columns [q | k | v] with head h owning
// columns [h*D, (h+1)*D) of each, as {q, k, v} (B, H, T, D) views (no copy).
//   dqkv = the three gradients written back into one (B, T, 3C) buffer
std::vector<Var> split_heads(const Var& qkv, int64_t n_head);
// Rows of x (..., T, D) picked along T: y[..., t, :] = x[..., index[..., t], :] -> (..., Tout, D).
// index is (Tout) (the same rows for every leading index) or x's leading dims and Tout
// (e.g. (B, H, Tout): a permutation per head). dx[..., index[..., t], :] += g[..., t, :].
Var gather_rows(const Var& x, const IndexTensor& index);
Var contiguous(const Var& x);                           // row-major copy          dx = g
Var detach(const Var& x);                               // stop-gradient           dx = 0

// ---- linear algebra (autograd/ops/linalg.cpp) -----------------------------
// a [..., M, K] @ b [..., K, N] -> [..., M, N]; ranks 2..4, batch dims broadcast.
// Transposed views are read without copies.   da = g b^T, db = a^T g (summed to shape)
Var matmul(const Var& a, const Var& b);
// x [..., K] @ weight [K, N] + bias [N] -> [..., N], one GEMM over all rows; bias may be undefined.
//   dx = g W^T, dW = x^T g, db = sum over rows of g
Var linear(const Var& x, const Var& weight, const Var& bias);
// A two-layer MLP as one op: h W2 [F, N] + b2 -> [..., N] with h = act(z), z = x [..., C] W1 [C, F] + b1;
// biases may be undefined. act (GELU, ReLU or SiLU) runs in the first GEMM's epilogue, which also keeps
// act'(z); the same numbers as linear(act(linear(x, W1, b1)), W2, b2) with the gelu, relu or silu op.
//   dz = (g W2^T) act'(z) (in that GEMM's epilogue), dx = dz W1^T, dW1 = x^T dz, db1 = sum dz,
//   dW2 = h^T g, db2 = sum g
Var feed_forward(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2, Activation act);

// ---- neural-network ops (autograd/ops/nn.cpp) -------------------------------
Var softmax(const Var& x);      // over the last axis: y = e^(x - max) / sum   dx = y (g - sum(g y))
Var log_softmax(const Var& x);  // y = x - logsumexp(x)                        dx = g - e^y sum(g)
// Fused LayerNorm over the last axis C; weight/bias [C] may be undefined Vars.
// y = w (x - mu) r + b, r = (var + eps)^-1/2
//   dx = r (gw - mean(gw) - xhat mean(gw xhat)), dw = sum g xhat, db = sum g
Var layer_norm(const Var& x, const Var& weight, const Var& bias, Scalar eps = 1e-5f);
// Fused RMSNorm: y = w x r, r = (mean(x^2) + eps)^-1/2    dx = r (gw - xhat mean(gw xhat))
Var rms_norm(const Var& x, const Var& weight, Scalar eps = 1e-5f);
// Mean negative log-likelihood of `targets` under logits [..., V]; targets have
// logits' shape without V. Rows whose target is ignore_index do not count (an
// all-ignored batch gives loss 0).   dlogits = (softmax(z) - onehot(t)) g / n
Var cross_entropy(const Var& logits, const IndexTensor& targets, int32_t ignore_index = -100);
// Fused causal multi-head self-attention on a packed projection qkv (B, T, 3C)
// with columns [q | k | v] and head h owning columns [h*D, (h+1)*D) of each:
// y = concat_h softmax(q_h k_h^T / sqrt(D) + causal mask) v_h -> (B, T, C).
// Optional dropout on the probabilities draws its mask from rng.
//   dv = P^T g, dP = g v^T, dS = P (dP - rowsum(P dP)), dq = dS k / sqrt(D), dk = dS^T q / sqrt(D)
Var causal_attention(const Var& qkv, int64_t n_head, Scalar dropout_p = 0, Rng* rng = nullptr);
// Rows of weight [V, C] picked by ids [...] -> [..., C]   dweight[id] += g (scatter-add)
Var embedding(const Var& weight, const IndexTensor& ids);

// ---- attention kernels (autograd/ops/softmax_attention.cpp, linear_attention.cpp) ----
// A group of heads of softmax_attention (AttentionSpec::groups).
struct AttentionHeadGroup {
  int64_t h0, h1;
  std::shared_ptr<const kernels::BlockMask> tiles;  // null with a period
  int64_t period = 0;
};

// A score modifier of softmax_attention with the parameter it learns
// (undefined: none); the op returns the parameter's gradient from the
// kernel's backward (core/kernels/score_mods.h says how a modifier adds it).
template <class Mod>
struct Modifier {
  std::shared_ptr<const Mod> mod;
  Var parameter = Var();
};

// What softmax_attention computes beyond q k^T / sqrt(D): FlexAttention's
// score and mask modifiers and block mask (core/kernels/score_mods.h,
// block_mask.h). A kind fills in what its math needs; the defaults are
// plain causal attention.
struct AttentionSpec {
  bool causal = true;  // query i sits at position Tk - Tq + i and sees keys j <= Tk - Tq + i
  // Constant additive terms, each broadcastable to (B, H, Tq, Tk) and read
  // through its strides (ALiBi's (1, H, Tq, 1) and (1, H, 1, Tk) parts, a
  // key padding (B, 1, 1, Tk) of 0 / -inf); summed first, in order.
  std::vector<Tensor> bias;
  std::vector<Modifier<kernels::ScoreTerm>> terms;  // then these terms, in order (adaptive span's bias by distance)
  std::vector<Modifier<kernels::ScoreMap>> maps;    // then s <- f(s), in order (a soft cap)
  std::vector<std::shared_ptr<const kernels::ScoreMask>> masks;  // then -inf where a mask hides the pair
  // The tiles computed (null: every tile); pairs its partial tiles hide are
  // -inf, so the result equals the dense one with those pairs masked.
  std::shared_ptr<const kernels::BlockMask> blocks;
  // Heads in groups with block masks of their own, in one op with one output
  // (no slices, no concat): heads [h0, h1) of a group attend through `tiles`,
  // or, with period = l > 0, query t sees the keys s <= t with
  // (t - s) % l == 0: each residue class mod l is a causal sequence, read in
  // place through strided views (Child et al.'s strided head; causal
  // self-attention, Tq == Tk). Groups cover the heads in order; the
  // modifiers see every pair at its position in the whole attention.
  std::vector<AttentionHeadGroup> groups;
  Scalar dropout_p = 0;  // on the probabilities: a counter-based hash of (a seed from rng, b, h, i, j)
  Rng* rng = nullptr;    // needed with dropout
};

// Memory-lean softmax attention, the one entry point of every softmax kind
// (core/kernels/flash_attention.h; the tape keeps q, k, v, y and the row
// log-sum-exp; probabilities are recomputed tile by tile, FlashAttention-style):
// q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> y (B, H, Tq, Dv),
//   s_ij = maps(q_i . k_j / sqrt(D) + sum_t term_t[b, h, i, j]), -inf where masked,
//   y_i = sum_j P~_ij v_j, P_i = softmax_j(s_ij), P~ = P * dropout mask.
// Inputs may be strided views whose last dim is contiguous (the heads of a
// packed qkv projection); y is a (B, H, Tq, Dv) view of a (B, Tq, H, Dv)
// buffer, so merging heads afterwards is free. A row with no visible key
// gives y_i = 0 and no gradient (or its mask's fallback key's value).
// lse, when given, receives the row log-sum-exp (B, H, Tq), differentiable
// too: dS_ij = P_ij (dP_ij - delta_i + dlse_i), so several calls can be
// combined with softmax weights of their lse (LSH's rounds); not with groups.
//   D_i = dy_i . y_i, dS = P (dP~ mask - D), dq = dS k / sqrt(D), dk = dS^T q / sqrt(D), dv = P~^T dy
Var softmax_attention(const Var& q, const Var& k, const Var& v, const AttentionSpec& spec = {}, Var* lse = nullptr);
// Kernelised linear attention (Katharopoulos et al. 2020) on features a =
// phi(q), b = phi(k) (B, H, T, C) (all > 0) and values v (B, H, T, M) -> (B, H, T, M):
//   causal: y_i = a_i^T S_i / (a_i . z_i + eps), S_i = sum_{j<=i} b_j v_j^T, z_i = sum_{j<=i} b_j;
//   non-causal: the same with S, z summed over all j.
// With g^_i = g_i / den_i, gam_i = -(g_i . y_i) / den_i (docs/math.md#backward-with-the-normaliser):
//   da_i = S_i g^_i + gam_i z_i, db_j = R_j v_j + r_j, dv_j = R_j^T b_j,
//   R_j = sum_{i>=j} a_i g^_i^T, r_j = sum_{i>=j} gam_i a_i.
// The causal form keeps only running C x M sums: no T x T and no T x C x M tensor.
Var linear_attention(const Var& a, const Var& b, const Var& v, bool causal = true, Scalar eps = 1e-6f);
// The causal numerator alone: y_i = sum_{j<=i} (a_i . b_j) v_j, (B, H, T, C) x 2, (B, H, T, M) -> (B, H, T, M).
//   da_i = S_i g_i, db_j = R_j v_j, dv_j = R_j^T b_j, R_j = sum_{i>=j} a_i g_i^T (Katharopoulos et al. 2020 §3.3.1)
Var causal_product(const Var& a, const Var& b, const Var& v);
// Efficient attention (Shen et al. 2021; docs/math.md#efficient-attention) on q, k (B, H, T, C), v (B, H, T, M) -> (B, H, T, M):
//   non-causal: y = softmax_C(q) (softmax_T(k)^T v);
//   causal: y_i = sum_d softmax(q_i)_d U_i[d] / u_i[d], U_i[d] = sum_{j<=i} e^{k_jd} v_j,
//   u_i[d] = sum_{j<=i} e^{k_jd}, kept with a running per-feature max (no overflow, no future keys).
// With al = softmax(q_i), rho_id = dy_i . U_i[d] / u_i[d], beta_ijd = e^{k_jd} / u_i[d]:
//   dq_i = al_i (rho_i - al_i . rho_i), dv_j = sum_{i>=j} sum_d al_id beta_ijd dy_i,
//   dk_jd = sum_{i>=j} al_id beta_ijd (dy_i . v_j - rho_id); the causal kernel keeps only running C x M sums.
Var efficient_attention(const Var& q, const Var& k, const Var& v, bool causal = true);
// Causal linear attention on log-features a, b (B, H, T, R), v (B, H, T, M) -> (B, H, T, M):
//   y_i = sum_r e^(a_ir) S_ir / sum_r e^(a_ir) z_ir, S_ir = sum_{j<=i} e^(b_jr) v_j, z_ir = sum_{j<=i} e^(b_jr),
// kept with running maxes so no exponent is positive (core/kernels/favor.h; Performer's FAVOR+ features
// e^(w . x' - |x'|^2 / 2) are passed as their logs). With P_ijr = e^(b_jr + a_ir) / den_i:
//   da_ir = sum_j P_ijr (g_i . v_j - g_i . y_i), db_jr = sum_{i>=j} P_ijr (g_i . v_j - g_i . y_i),
//   dv_j = sum_{i>=j} sum_r P_ijr g_i
Var favor_attention(const Var& a, const Var& b, const Var& v);

// ---- gates (autograd/ops/gates.cpp) -------------------------------------------
// GTrXL's GRU-type gate (Parisotto et al. 2020 §3.2) of the residual stream x and a branch
// output y, both (..., C), with w (C, 3C) = [W_r | W_z | W_g], u (C, 2C) =
// [U_r | U_z], ug (C, C) = U_g and the bias bg (C):
//   r = sigmoid(y W_r + x U_r), z = sigmoid(y W_z + x U_z - bg),
//   h = tanh(y W_g + (r x) U_g), g = (1 - z) x + z h.
// Backward (docs/math.md#gru-gate-backward): dz = dg (h - x), dc = dg z (1 - h^2), e = dc U_g^T,
//   da = e x r (1 - r), db = dz z (1 - z); dx = dg (1 - z) + e r + [da db] u^T,
//   dy = [da db dc] w^T, dw = y^T [da db dc], du = x^T [da db], dug = (r x)^T dc, dbg = -sum db.
Var gru_gate(const Var& x, const Var& y, const Var& w, const Var& u, const Var& ug, const Var& bg);

// ---- positional (autograd/ops/positional.cpp) --------------------------------
// Rotary position embedding (RoPE, Su et al. 2021; interleaved pairs): x with positions
// start + t along `axis` and features along the last axis (width D); pair k
// (components 2k, 2k+1, k < D/2; an odd last component is left as is) is
// rotated by the angle p th_k, th_k = base^(-2k / (2 floor(D / 2))).
//   dx = g rotated by -p th_k
Var rotary(const Var& x, int axis, int64_t start, Scalar base = 10000);
// Shaw et al.'s clipped relative positions. Query i sits at position q_start + i,
// key j at k_start + j; their offset o = clamp(k_start + j - q_start - i, -K, K)
// picks column o + K of a table of 2K + 1 offsets.
// r (..., Tq, 2K+1) -> (..., Tq, Tk): y[.., i, j] = r[.., i, o(i, j) + K]    dr = relative_scatter(g)
Var relative_gather(const Var& r, int64_t Tk, int64_t q_start, int64_t k_start);
// p (..., Tq, Tk) -> (..., Tq, 2K+1): y[.., i, c] = sum_{j : o(i, j) + K = c} p[.., i, j]   dp = relative_gather(g)
Var relative_scatter(const Var& p, int64_t K, int64_t q_start, int64_t k_start);

}  // namespace tapeformer
