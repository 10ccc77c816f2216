#include "core/kernels/matmul.h"

#include <algorithm>
#include <vector>

#include "core/eigen.h"
#include "core/error.h"
#include "core/parallel.h"

namespace tapeformer::kernels {
namespace {

template <class MA, class MB>
void product(const MA& a, const MB& b, eigen::MatrixMap c, bool accumulate) {
  if (accumulate) {
    c.noalias() += a * b;
  } else {
    c.noalias() = a * b;
  }
}

template <class MA>
void dispatch_b(const MA& a, const MatRef& b, eigen::MatrixMap c, bool accumulate) {
  if (b.col_stride == 1) {
    product(a, eigen::matrix(b.data, b.rows, b.cols, b.row_stride), c, accumulate);
  } else {
    product(a, eigen::col_matrix(b.data, b.rows, b.cols, b.col_stride), c, accumulate);
  }
}

MatRef matrix_of(const Tensor& t, const Scalar* base) {
  const int r = t.rank();
  return MatRef{base, t.dim(r - 2), t.dim(r - 1), t.strides()[r - 2], t.strides()[r - 1]};
}

}  // namespace

bool is_matrix_layout(const Tensor& t) {
  const int r = t.rank();
  if (r < 2) return false;
  const int64_t rs = t.strides()[r - 2], cs = t.strides()[r - 1];
  const int64_t rows = t.dim(r - 2), cols = t.dim(r - 1);
  // Row-major rows (cs == 1) or column-major (rs == 1); size-1 dims may carry any stride.
  if ((cs == 1 || cols == 1) && rs >= std::max<int64_t>(cols, 1)) return true;
  if ((rs == 1 || rows == 1) && cs >= std::max<int64_t>(rows, 1)) return true;
  return false;
}

void gemm(const MatRef& a, const MatRef& b, Scalar* c, int64_t ldc, bool accumulate) {
  auto cm = eigen::matrix(c, a.rows, b.cols, ldc);
  if (a.rows == 0 || b.cols == 0) return;
  if (a.cols == 0) {
    if (!accumulate) cm.setZero();
    return;
  }
  // A size-1 dim may have an arbitrary stride; normalise so the dispatch below
  // sees a consistent layout.
  MatRef aa = a, bb = b;
  if (aa.cols == 1) aa.col_stride = 1, aa.row_stride = std::max<int64_t>(aa.row_stride, 1);
  if (bb.cols == 1) bb.col_stride = 1, bb.row_stride = std::max<int64_t>(bb.row_stride, 1);
  if (aa.col_stride == 1) {
    dispatch_b(eigen::matrix(aa.data, aa.rows, aa.cols, aa.row_stride), bb, cm, accumulate);
  } else {
    dispatch_b(eigen::col_matrix(aa.data, aa.rows, aa.cols, aa.col_stride), bb, cm, accumulate);
  }
}

void batched_matmul(const Tensor& a_in, const Tensor& b_in, Tensor& out, bool accumulate) {
  const Tensor a = is_matrix_layout(a_in) ? a_in : a_in.contiguous();
  const Tensor b = is_matrix_layout(b_in) ? b_in : b_in.contiguous();
  const int r = out.rank();
  TAPEFORMER_CHECK(out.is_contiguous() && a.rank() == r && b.rank() == r,
                   "batched_matmul: internal layout mismatch ", a.shape(), " x ", b.shape(),
                   " -> ", out.shape());
  const int64_t M = out.dim(r - 2), N = out.dim(r - 1), K = a.dim(r - 1);
  const int64_t batch = out.numel() / std::max<int64_t>(1, M * N);
  if (out.numel() == 0) return;

  // Per batch index, the element offsets of a and b (their batch strides may be 0).
  std::vector<int64_t> a_off(batch), b_off(batch);
  for (int64_t bi = 0; bi < batch; ++bi) {
    int64_t rem = bi, ao = 0, bo = 0;
    for (int d = r - 3; d >= 0; --d) {
      const int64_t idx = rem % out.dim(d);
      rem /= out.dim(d);
      ao += idx * a.strides()[d];
      bo += idx * b.strides()[d];
    }
    a_off[bi] = ao;
    b_off[bi] = bo;
  }

  // Split rows so there are enough work items for all threads, but keep blocks
  // big enough for Eigen's packing to pay off.
  const int threads = parallel::num_threads();
  const int64_t flops = M * N * K;
  int64_t row_blocks = 1;
  if (batch < threads && flops >= (int64_t{1} << 15)) {
    row_blocks = std::min<int64_t>((threads + batch - 1) / batch * 2, std::max<int64_t>(1, M / 16));
  }
  const int64_t rows_per = (M + row_blocks - 1) / row_blocks;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, flops));
  Scalar* c = out.data();
  const Scalar* ab = a.data();
  const Scalar* bb = b.data();
  parallel::parallel_for(batch * row_blocks, grain, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t bi = w / row_blocks, m0 = (w % row_blocks) * rows_per;
      const int64_t m1 = std::min(M, m0 + rows_per);
      if (m0 >= m1) continue;
      MatRef am = matrix_of(a, ab + a_off[bi]);
      am.data += m0 * am.row_stride;
      am.rows = m1 - m0;
      gemm(am, matrix_of(b, bb + b_off[bi]), c + bi * M * N + m0 * N, N, accumulate);
    }
  });
}

}  // namespace tapeformer::kernels
