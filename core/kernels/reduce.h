// Reductions along one axis, viewed as [outer, n, inner] over a contiguous tensor.
#pragma once

#include <vector>

#include "tapeformer/core/tensor.h"

namespace tapeformer::kernels {

// Sum over `axis` (already normalised); the reduced dim is kept as size 1.
Tensor sum_axis(const Tensor& x, int axis);
// Max over `axis` with the reduced dim kept as size 1; argmax receives, per
// output element, the index along `axis` of the first maximum.
Tensor max_axis(const Tensor& x, int axis, std::vector<int32_t>* argmax);
// Inclusive cumulative sum along `axis`; reverse = sum from the end.
Tensor cumsum_axis(const Tensor& x, int axis, bool reverse);
// Sums g down to `shape` (the inverse of broadcasting `shape` to g.shape()).
Tensor sum_to(const Tensor& g, const Shape& shape);

}  // namespace tapeformer::kernels
