#include "tapeformer/core/kernels/elementwise.h"

#include "tapeformer/core/eigen.h"
#include "tapeformer/core/profile.h"

namespace tapeformer::kernels {

void add_inplace(Tensor& acc, const Tensor& x_in) {
  const profile::Scope timed("elementwise");
  TAPEFORMER_CHECK(acc.shape() == x_in.shape(), "add_inplace: shapes differ: ", acc.shape(),
                   " vs ", x_in.shape());
  TAPEFORMER_CHECK(acc.is_contiguous(), "add_inplace: accumulator must be contiguous");
  const Tensor x = x_in.contiguous();
  Scalar* ap = acc.data();
  const Scalar* xp = x.data();
  parallel::parallel_for(acc.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    eigen::array(ap + b, e - b) += eigen::array(xp + b, e - b);
  });
}

}  // namespace tapeformer::kernels
