// The BLAS routines FAISS calls, on Eigen, in place of the system BLAS.
//
// Debian's libfaiss.a names libblas.so and liblapack.so, which resolve to
// OpenBLAS: loading it reserves buffers and starts its threads before main()
// (it spins forever under `ulimit -v`, and every tapeformer command would
// pay for it), and its threads would fight TBB's. The three index kinds
// tapeformer builds need only matrix products (exact search of a block of
// queries, k-means of ivf): sgemm_ and dgemm_ (and ssyrk_) are computed here,
// single-threaded inside the caller's TBB block. The LAPACK
// routines that other FAISS indexes use (PCA, OPQ, rotations, additive
// quantizers) are refused with an Error naming them.
//
// Fortran conventions: column-major, every argument by pointer. FAISS passes
// its integers as FINTEGER (int or long, by its build); reading them as int
// is right for either on a little-endian machine while they stay below 2^31.
#define EIGEN_DONT_PARALLELIZE  // the caller's thread is the only one
#include <Eigen/Core>

#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/matmul.h"

namespace tapeformer {
namespace {

template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
template <class T>
using ConstMap = Eigen::Map<const Matrix<T>, 0, Eigen::OuterStride<>>;
template <class T>
using MutMap = Eigen::Map<Matrix<T>, 0, Eigen::OuterStride<>>;

bool transposed(const char* t) { return *t == 'T' || *t == 't' || *t == 'C' || *t == 'c'; }

// C (m, n) = alpha op(A) op(B) + beta C, op(A) (m, k), op(B) (k, n); C is
// not read when beta is 0 (BLAS's rule: it may hold anything). float:
// tapeformer's product kernel, which sums over k in order on every machine
// (C^T = op(B)^T op(A)^T, row-major, is C column-major); double (no index
// tapeformer builds uses it): plain loops in the same order.
void scale_c(int m, int n, float beta, float* c, int ldc) {
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) c[i + j * ldc] = beta == 0.0f ? 0.0f : beta * c[i + j * ldc];
}
void gemm(const char* ta, const char* tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
          int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  if (beta != 1.0f) scale_c(m, n, beta, c, ldc);
  if (k <= 0 || alpha == 0.0f) return;
  const bool at = transposed(ta), bt = transposed(tb);
  const kernels::MatRef opb_t = bt ? kernels::MatRef{b, n, k, 1, ldb} : kernels::MatRef{b, n, k, ldb, 1};  // (n, k)
  const kernels::MatRef opa_t = at ? kernels::MatRef{a, k, m, 1, lda} : kernels::MatRef{a, k, m, lda, 1};  // (k, m)
  thread_local std::vector<float> p;
  p.resize(static_cast<size_t>(n) * static_cast<size_t>(m));
  kernels::gemm_fp32(opb_t, opa_t, p.data(), m, false);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) c[i + j * ldc] += alpha * p[static_cast<size_t>(j) * m + i];
}
void gemm(const char* ta, const char* tb, int m, int n, int k, double alpha, const double* a, int lda,
          const double* b, int ldb, double beta, double* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  const bool at = transposed(ta), bt = transposed(tb);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double s = 0;
      for (int p = 0; p < k; ++p) s += (at ? a[p + i * lda] : a[i + p * lda]) * (bt ? b[j + p * ldb] : b[p + j * ldb]);
      c[i + j * ldc] = (beta == 0.0 ? 0.0 : beta * c[i + j * ldc]) + alpha * s;
    }
}

[[noreturn]] void no_lapack(const char* routine) {
  fail("index: FAISS called LAPACK's ", routine,
       ", which tapeformer does not link: only the exact, ivf and hnsw index kinds are supported");
}

}  // namespace
}  // namespace tapeformer

extern "C" {

int sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
           const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
           const int* ldc) {
  tapeformer::gemm(ta, tb, *m, *n, *k, *alpha, a, *lda, b, *ldb, *beta, c, *ldc);
  return 0;
}

int dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
           const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
           const int* ldc) {
  tapeformer::gemm(ta, tb, *m, *n, *k, *alpha, a, *lda, b, *ldb, *beta, c, *ldc);
  return 0;
}

// C (n, n) = alpha op(A) op(A)^T + beta C on the `uplo` triangle only;
// op(A) = A (n, k) for trans 'N', A^T for 'T'.
int ssyrk_(const char* uplo, const char* trans, const int* n, const int* k, const float* alpha, const float* a,
           const int* lda, const float* beta, float* c, const int* ldc) {
  const int N = *n, K = *k;
  if (N <= 0) return 0;
  const bool t = tapeformer::transposed(trans);
  // full = op(A) op(A)^T through the same product kernel: op(A) (N, K).
  tapeformer::Matrix<float> full(N, N);
  const float zero = 0.0f, one = 1.0f;
  tapeformer::gemm(t ? "T" : "N", t ? "N" : "T", N, N, K, one, a, *lda, a, *lda, zero, full.data(), N);
  tapeformer::MutMap<float> C(c, N, N, Eigen::OuterStride<>(*ldc));
  const bool upper = *uplo == 'U' || *uplo == 'u';
  for (int j = 0; j < N; ++j)
    for (int i = upper ? 0 : j; i < (upper ? j + 1 : N); ++i)
      C(i, j) = *alpha * full(i, j) + (*beta == 0.0f ? 0.0f : *beta * C(i, j));
  return 0;
}

int sgeqrf_() { tapeformer::no_lapack("sgeqrf"); }
int sorgqr_() { tapeformer::no_lapack("sorgqr"); }
int sgesvd_() { tapeformer::no_lapack("sgesvd"); }
int dgesvd_() { tapeformer::no_lapack("dgesvd"); }
int dsyev_() { tapeformer::no_lapack("dsyev"); }
int sgelsd_() { tapeformer::no_lapack("sgelsd"); }
int sgetrf_() { tapeformer::no_lapack("sgetrf"); }
int sgetri_() { tapeformer::no_lapack("sgetri"); }
int dgetrf_() { tapeformer::no_lapack("dgetrf"); }
int dgetri_() { tapeformer::no_lapack("dgetri"); }

}  // extern "C"

namespace tapeformer {
// Referenced by vector_index.cpp, so that this object is taken from the
// static library before libfaiss.a, whose calls it then resolves.
int retrieval_blas_linked = 1;
}  // namespace tapeformer
