// The BLAS routines FAISS calls, on Eigen, in place of the system BLAS.
//
// Debian's libfaiss.a names libblas.so and liblapack.so, which resolve to
// OpenBLAS: loading it reserves buffers and starts its threads before main()
// (it spins forever under `ulimit -v`, and every tapeformer command would
// pay for it), and its threads would fight TBB's. The three index kinds
// tapeformer builds need only matrix products (exact search of a block of
// queries, k-means of ivf): sgemm_ and dgemm_ (and ssyrk_) are computed here
// with Eigen, single-threaded inside the caller's TBB block. The LAPACK
// routines that other FAISS indexes use (PCA, OPQ, rotations, additive
// quantizers) are refused with an Error naming them.
//
// Fortran conventions: column-major, every argument by pointer. FAISS passes
// its integers as FINTEGER (int or long, by its build); reading them as int
// is right for either on a little-endian machine while they stay below 2^31.
#define EIGEN_DONT_PARALLELIZE  // the caller's thread is the only one
#include <Eigen/Core>

#include "tapeformer/core/error.h"

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
// not read when beta is 0 (BLAS's rule: it may hold anything).
template <class T>
void gemm(const char* ta, const char* tb, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb,
          T beta, T* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  MutMap<T> C(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == T(0))
    C.setZero();
  else if (beta != T(1))
    C *= beta;
  if (k <= 0 || alpha == T(0)) return;
  const bool at = transposed(ta), bt = transposed(tb);
  const ConstMap<T> A(a, at ? k : m, at ? m : k, Eigen::OuterStride<>(lda));
  const ConstMap<T> B(b, bt ? n : k, bt ? k : n, Eigen::OuterStride<>(ldb));
  if (!at && !bt) C.noalias() += alpha * (A * B);
  if (!at && bt) C.noalias() += alpha * (A * B.transpose());
  if (at && !bt) C.noalias() += alpha * (A.transpose() * B);
  if (at && bt) C.noalias() += alpha * (A.transpose() * B.transpose());
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
  const tapeformer::ConstMap<float> A(a, t ? K : N, t ? N : K, Eigen::OuterStride<>(*lda));
  tapeformer::Matrix<float> full = t ? tapeformer::Matrix<float>(A.transpose() * A) : tapeformer::Matrix<float>(A * A.transpose());
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
