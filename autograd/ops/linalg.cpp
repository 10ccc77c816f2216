// Batched matrix product.
#include "tapeformer/autograd/ops.h"

#include <algorithm>

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/activation.h"
#include "tapeformer/core/kernels/matmul.h"
#include "tapeformer/core/kernels/reduce.h"
#include "tapeformer/core/parallel.h"

namespace tapeformer {
namespace {

// out = a @ b for same-rank operands whose batch dims already match out's.
Tensor product(const Tensor& a, const Tensor& b, const Shape& out_shape) {
  Tensor out = Tensor::empty(out_shape);
  kernels::batched_matmul(a, b, out);
  return out;
}

Shape with_matrix(Shape batch, int64_t rows, int64_t cols) {
  batch.push_back(rows);
  batch.push_back(cols);
  return batch;
}

}  // namespace

Var matmul(const Var& a, const Var& b) {
  TAPEFORMER_CHECK(a.defined() && b.defined(), "matmul: undefined input");
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  TAPEFORMER_CHECK(as.rank() >= 2 && as.rank() <= 4 && bs.rank() >= 2 && bs.rank() <= 4,
                   "matmul: operands must have rank 2 to 4: ", as, " x ", bs);
  TAPEFORMER_CHECK(as[-1] == bs[-2], "matmul: inner dims differ: ", as, " x ", bs);
  const int64_t M = as[-2], K = as[-1], N = bs[-1];

  // b is one matrix: one GEMM over all rows of a (see linear).
  if (bs.rank() == 2) return linear(a, b, Var());

  // General case: broadcast the batch dims with stride-0 views (no copies).
  Shape a_batch, b_batch;
  for (int i = 0; i < as.rank() - 2; ++i) a_batch.push_back(as[i]);
  for (int i = 0; i < bs.rank() - 2; ++i) b_batch.push_back(bs[i]);
  const Shape batch = broadcast_shapes(a_batch, b_batch, "matmul");
  const Tensor ae = a.value().expand(with_matrix(batch, M, K));
  const Tensor be = b.value().expand(with_matrix(batch, K, N));
  const Shape out_shape = with_matrix(batch, M, N);
  Var out = make_result(product(ae, be, out_shape), {&a, &b});
  record_backward(out, [a, b, ae, be, batch, M, K, N](const Tensor& g) {
    const int r = batch.rank() + 2;
    if (a.requires_grad())
      accumulate_grad(a, kernels::sum_to(product(g, be.transpose(r - 2, r - 1), with_matrix(batch, M, K)),
                                         a.shape()), "matmul");
    if (b.requires_grad())
      accumulate_grad(b, kernels::sum_to(product(ae.transpose(r - 2, r - 1), g, with_matrix(batch, K, N)),
                                         b.shape()), "matmul");
  });
  return out;
}

namespace {

// bias [N] (or undefined) for weight [K, N].
void check_bias(const char* op, const Var& bias, const Var& weight) {
  TAPEFORMER_CHECK(!bias.defined() || (bias.rank() == 1 && bias.dim(0) == weight.dim(1)), op, ": bias ",
                   bias.defined() ? bias.shape().str() : "", " must be [", weight.dim(1), "] for weight ",
                   weight.shape());
}

// x [..., K] against weight [K, N] and bias [N] (bias may be undefined).
void check_linear(const char* op, const Var& x, const Var& weight, const Var& bias) {
  TAPEFORMER_CHECK(x.defined() && weight.defined(), op, ": undefined input");
  TAPEFORMER_CHECK(weight.rank() == 2, op, ": weight must be [in, out], got ", weight.shape());
  TAPEFORMER_CHECK(x.rank() >= 1 && x.shape()[-1] == weight.dim(0), op, ": input ", x.shape(),
                   " last dim does not match weight [in, out] = ", weight.shape());
  check_bias(op, bias, weight);
}

// out (rows, N) = x2 (rows, K) W + bias, then the epilogue. The bias seeds the
// GEMM's accumulators: no separate pass over out.
Tensor affine(const Tensor& x2, const Var& weight, const Var& bias,
              const kernels::Epilogue& epilogue = {}) {
  Tensor out = Tensor::empty({x2.dim(0), weight.dim(1)});  // (rows, N)
  kernels::batched_matmul(x2, weight.value(), out, /*accumulate=*/false,
                          bias.defined() ? bias.value().contiguous() : Tensor(), epilogue);
  return out;
}

// W^T [N, K] for the backward's dx = g W^T: the packet GEMM reads B by rows.
// (Copying it in the forward instead, right after the GEMM had left W in
// cache, made the copy cheaper but not the step measurably faster, and kept
// every copy alive until the backward.) A weight that is itself a transposed
// view needs no copy.
Tensor transposed_weight(const Var& weight) { return weight.value().transpose(0, 1).contiguous(); }

Shape with_last(Shape s, int64_t n) {
  s[-1] = n;
  return s;
}

}  // namespace

Var linear(const Var& x, const Var& weight, const Var& bias) {
  check_linear("linear", x, weight, bias);
  const int64_t K = weight.dim(0), N = weight.dim(1);
  // Fold every leading dim into rows: x [B, T, K] @ W [K, N] is one [B*T, K] x [K, N] GEMM.
  const Tensor x2 = x.value().reshape({-1, K});  // (rows, K)
  Var out = make_result(affine(x2, weight, bias).reshape(with_last(x.shape(), N)), {&x, &weight, &bias});
  if (!out.requires_grad()) return out;
  // A rebuildable x (a LayerNorm's output) is not kept: dW rebuilds it.
  record_backward(out, [x, weight, bias, kept = x.rebuildable() ? Tensor() : x2, K, N](const Tensor& g) {
    const Tensor g2 = g.reshape({-1, N});  // (rows, N)
    const Tensor x2 = kept.defined() || !weight.requires_grad() ? kept : x.value_once().reshape({-1, K});
    Tensor dx, dw;
    // The two GEMMs are independent: run them side by side, each unsplit.
    parallel::invoke(
        [&] {  // dx = g W^T
          if (x.requires_grad()) dx = product(g2, transposed_weight(weight), {g2.dim(0), K});
        },
        [&] {  // dW = x^T g
          if (weight.requires_grad()) dw = product(x2.transpose(0, 1), g2, {K, N});
        });
    if (dx.defined()) {
      // Keep one handle on dx's buffer, so the accumulator can adopt it
      // instead of copying it.
      dx = dx.reshape(x.shape());
      accumulate_grad(x, dx, "linear");
    }
    if (dw.defined()) accumulate_grad(weight, dw, "linear");
    if (bias.requires_grad())  // db = sum over rows of g
      accumulate_grad(bias, kernels::sum_axis(g2, 0).reshape({N}), "linear");
  });
  return out;
}

Var feed_forward(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2, Activation act) {
  check_linear("feed_forward (first layer)", x, w1, b1);
  TAPEFORMER_CHECK(w2.defined() && w2.rank() == 2 && w2.dim(0) == w1.dim(1), "feed_forward: second weight ",
                   w2.defined() ? w2.shape().str() : "(undefined)", " must be [", w1.dim(1), ", out] after ",
                   w1.shape());
  check_bias("feed_forward (second layer)", b2, w2);
  const int64_t C = w1.dim(0), F = w1.dim(1), N = w2.dim(1);
  const bool first = x.requires_grad() || w1.requires_grad() || b1.requires_grad();  // needs dz
  const Tensor x2 = x.value().reshape({-1, C});  // (rows, C)
  // The activation runs in the first GEMM's epilogue. When a backward will
  // need them, it keeps the activation's input z, one (rows, F) buffer, and
  // the backward recomputes h = act(z) and act'(z) from it (one elementwise
  // pass, the same bits as the epilogue's) instead of keeping both.
  Tensor z = grad_enabled() ? Tensor::empty({x2.dim(0), F}) : Tensor();  // (rows, F)
  const Tensor h = affine(x2, w1, b1,
                          z.defined() ? kernels::Epilogue::activate_keeping_input(act, z.data())
                                      : kernels::Epilogue::activate(act, nullptr));  // (rows, F)
  Var out = make_result(affine(h, w2, b2).reshape(with_last(x.shape(), N)), {&x, &w1, &b1, &w2, &b2});
  if (!out.requires_grad()) return out;
  // A rebuildable x (a LayerNorm's output) is not kept: dW1 rebuilds it.
  record_backward(out, [x, w1, b1, w2, b2, kept = x.rebuildable() ? Tensor() : x2, z, act, first, C, F,
                        N](const Tensor& g) {
    const Tensor g2 = g.reshape({-1, N});  // (rows, N)
    const Tensor x2 = kept.defined() || !w1.requires_grad() ? kept : x.value_once().reshape({-1, C});
    const int64_t rows = g2.dim(0);
    // h = act(z) and act'(z), recomputed.
    Tensor h = Tensor::empty({rows, F}), dact = first ? Tensor::empty({rows, F}) : Tensor();  // (rows, F) each
    parallel::parallel_for(rows, std::max<int64_t>(1, 16384 / F), [&](int64_t r0, int64_t r1) {
      std::copy_n(z.data() + r0 * F, (r1 - r0) * F, h.data() + r0 * F);
      kernels::activate_rows(act, h.data() + r0 * F, dact.defined() ? dact.data() + r0 * F : nullptr, (r1 - r0) * F);
    });
    Tensor dz, dw2;
    parallel::invoke(
        [&] {  // dz = (g W2^T) act'(z), the multiply in the GEMM's epilogue
          if (!first) return;
          dz = Tensor::empty({rows, F});  // (rows, F)
          kernels::batched_matmul(g2, transposed_weight(w2), dz, false, Tensor(),
                                  kernels::Epilogue::multiply(dact.data()));
        },
        [&] {  // dW2 = h^T g
          if (w2.requires_grad()) dw2 = product(h.transpose(0, 1), g2, {F, N});
        });
    Tensor dx, dw1;
    if (first) {
      parallel::invoke(
          [&] {  // dx = dz W1^T
            if (x.requires_grad()) dx = product(dz, transposed_weight(w1), {rows, C});
          },
          [&] {  // dW1 = x^T dz
            if (w1.requires_grad()) dw1 = product(x2.transpose(0, 1), dz, {C, F});
          });
    }
    if (dx.defined()) {
      dx = dx.reshape(x.shape());  // one handle: the accumulator adopts the buffer
      accumulate_grad(x, dx, "feed_forward");
    }
    if (dw1.defined()) accumulate_grad(w1, dw1, "feed_forward");
    if (b1.requires_grad()) accumulate_grad(b1, kernels::sum_axis(dz, 0).reshape({F}), "feed_forward");
    if (dw2.defined()) accumulate_grad(w2, dw2, "feed_forward");
    if (b2.requires_grad()) accumulate_grad(b2, kernels::sum_axis(g2, 0).reshape({N}), "feed_forward");
  });
  return out;
}

}  // namespace tapeformer
