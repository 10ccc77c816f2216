#include "tapeformer/core/kernels/score_mods.h"

#include "tapeformer/core/eigen.h"

namespace tapeformer::kernels {

void BiasTerm::add(const ScoreRow& r, Scalar* sum) const {
  const Scalar* p = data_ + r.b * sb_ + r.h * sh_ + r.i * si_ + r.j0 * sj_;
  const int64_t sj = sj_ * r.step;
  if (sj == 1) {
    eigen::array(sum, r.n) += eigen::array(p, r.n);
  } else if (sj == 0) {  // constant along the row (ALiBi's row part, query padding)
    eigen::array(sum, r.n) += *p;
  } else {
    for (int64_t x = 0; x < r.n; ++x) sum[x] += p[x * sj];
  }
}

}  // namespace tapeformer::kernels
