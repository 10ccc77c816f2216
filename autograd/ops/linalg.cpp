// Batched matrix product.
#include "autograd/ops.h"
#include "core/error.h"
#include "core/kernels/matmul.h"
#include "core/kernels/reduce.h"

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

  // b is one matrix: fold a's batch dims into rows, so one GEMM does the whole
  // batch (x [B, T, C] @ W [C, N] is a single [B*T, C] x [C, N] product).
  if (bs.rank() == 2) {
    const Tensor a2 = a.value().reshape({-1, K});  // (B*T, K)
    Shape out_shape = as;
    out_shape[-1] = N;
    Var out = make_result(product(a2, b.value(), {a2.dim(0), N}).reshape(out_shape), {&a, &b});
    record_backward(out, [a, b, a2, K, N](const Tensor& g) {
      const Tensor g2 = g.reshape({-1, N});  // (B*T, N)
      if (a.requires_grad())
        accumulate_grad(a, product(g2, b.value().transpose(0, 1), {g2.dim(0), K}).reshape(a.shape()),
                        "matmul");
      if (b.requires_grad())
        accumulate_grad(b, product(a2.transpose(0, 1), g2, {K, N}), "matmul");
    });
    return out;
  }

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

}  // namespace tapeformer
