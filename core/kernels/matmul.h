// Matrix products: one packet kernel, which sums every element over k in
// order (so the bits do not depend on the vector width, the cache sizes or
// how callers split rows); parallelised over batch x row blocks.
#pragma once

#include "tapeformer/core/kernels/activation.h"
#include "tapeformer/core/kernels/matref.h"
#include "tapeformer/core/tensor.h"

namespace tapeformer::kernels {

// True when the last two dims of t can be read as a MatRef without a copy.
bool is_matrix_layout(const Tensor& t);

// What gemm does with each element z of A B (+ bias) before storing it in C:
// the activation or the multiply of a fused layer, applied while the result is
// still in registers instead of in another pass over memory. `aux` is laid out
// like C (same leading dimension; for batched_matmul, like `out`).
struct Epilogue {
  enum class Op { Store, Activate, ActivateKeepInput, Multiply };
  Op op = Op::Store;
  Activation act = Activation::Gelu;
  Scalar* aux = nullptr;

  // C = act(z), and aux = act'(z) when dydx is not null.
  static Epilogue activate(Activation a, Scalar* dydx) { return {Op::Activate, a, dydx}; }
  // C = act(z), and aux = z itself (a backward recomputes act and act' from
  // it with activate_rows, to the same bits).
  static Epilogue activate_keeping_input(Activation a, Scalar* z) { return {Op::ActivateKeepInput, a, z}; }
  // C = z * factor, elementwise.
  static Epilogue multiply(const Scalar* factor) {
    return {Op::Multiply, Activation::Gelu, const_cast<Scalar*>(factor)};  // only read
  }
};

// C = A B (or C += A B when accumulate), plus bias[j] in column j of every
// row when bias is not null, then the epilogue (which needs accumulate ==
// false). C is row-major with leading dim ldc.
// Single-threaded; callers parallelise. Every element is summed over k in
// order, so splitting rows across calls does not change results; a B with
// strided rows is copied first. Products run in product_precision().
void gemm(const MatRef& a, const MatRef& b, Scalar* c, int64_t ldc, bool accumulate,
          const Scalar* bias = nullptr, const Epilogue& epilogue = {});
// gemm in float32 whatever the product precision (scores that choose, such
// as a memory's nearest keys, and the small products inside a scan).
void gemm_fp32(const MatRef& a, const MatRef& b, Scalar* c, int64_t ldc, bool accumulate,
               const Scalar* bias = nullptr, const Epilogue& epilogue = {});

// out[..., M, N] = a[..., M, K] @ b[..., K, N] where the batch dims of a and b
// are already broadcast to out's batch dims (stride-0 views are fine).
// Inputs may be transposed views; out must be contiguous. A defined `bias`
// (contiguous, N elements) is added to every row of out; the epilogue's aux
// buffer, if any, has out's (contiguous) layout.
void batched_matmul(const Tensor& a, const Tensor& b, Tensor& out, bool accumulate = false,
                    const Tensor& bias = Tensor(), const Epilogue& epilogue = {});

}  // namespace tapeformer::kernels
