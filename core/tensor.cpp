#include "tapeformer/core/tensor.h"

#include <algorithm>
#include <cstring>
#include <ostream>

#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/copy.h"

namespace tapeformer {

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset)
    : storage_(std::move(storage)), shape_(shape), strides_(strides), offset_(offset) {}

void Tensor::require_defined(const char* op) const {
  TAPEFORMER_CHECK(defined(), op, ": tensor is undefined");
}

Tensor Tensor::empty(const Shape& shape) {
  for (int64_t d : shape) TAPEFORMER_CHECK(d >= 0, "Tensor::empty: negative dim in ", shape);
  return Tensor(std::make_shared<Storage>(shape.numel()), shape, contiguous_strides(shape), 0);
}

Tensor Tensor::over(std::shared_ptr<Storage> storage, const Shape& shape, int64_t offset) {
  TAPEFORMER_CHECK(storage && offset >= 0 && offset + shape.numel() <= storage->size(), "Tensor::over: ", shape,
                   " at ", offset, " does not fit a storage of ", storage ? storage->size() : 0, " floats");
  return Tensor(std::move(storage), shape, contiguous_strides(shape), offset);
}

Tensor Tensor::zeros(const Shape& shape) { return full(shape, 0.0f); }
Tensor Tensor::ones(const Shape& shape) { return full(shape, 1.0f); }

Tensor Tensor::full(const Shape& shape, Scalar value) {
  Tensor t = empty(shape);
  std::fill(t.data(), t.data() + t.numel(), value);
  return t;
}

Tensor Tensor::scalar(Scalar value) { return full(Shape{}, value); }

Tensor Tensor::from(const Shape& shape, const std::vector<Scalar>& values) {
  TAPEFORMER_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "Tensor::from: ",
                   values.size(), " values for shape ", shape, " (needs ", shape.numel(), ")");
  Tensor t = empty(shape);
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

Tensor Tensor::arange(int64_t n) {
  Tensor t = empty(Shape{n});
  for (int64_t i = 0; i < n; ++i) t.data()[i] = static_cast<Scalar>(i);
  return t;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

Scalar* Tensor::data() {
  require_defined("Tensor::data");
  return storage_->data() + offset_;
}
const Scalar* Tensor::data() const {
  require_defined("Tensor::data");
  return storage_->data() + offset_;
}

namespace {
int64_t flat_offset(const Shape& shape, const Strides& strides, int64_t offset,
                    std::initializer_list<int64_t> index) {
  TAPEFORMER_CHECK(static_cast<int>(index.size()) == shape.rank(), "Tensor::at: index of rank ",
                   index.size(), " for tensor ", shape);
  int64_t off = offset;
  int i = 0;
  for (int64_t v : index) {
    TAPEFORMER_CHECK(v >= 0 && v < shape[i], "Tensor::at: index ", v, " out of range for dim ", i,
                     " of ", shape);
    off += v * strides[i];
    ++i;
  }
  return off;
}
}  // namespace

Scalar Tensor::at(std::initializer_list<int64_t> index) const {
  require_defined("Tensor::at");
  return storage_->data()[flat_offset(shape_, strides_, offset_, index)];
}
Scalar& Tensor::at(std::initializer_list<int64_t> index) {
  require_defined("Tensor::at");
  return storage_->data()[flat_offset(shape_, strides_, offset_, index)];
}

Tensor Tensor::shape_only() const {
  Tensor t = *this;
  t.storage_.reset();
  return t;
}

Scalar Tensor::item() const {
  require_defined("Tensor::item");
  TAPEFORMER_CHECK(numel() == 1, "Tensor::item: tensor ", shape_, " has ", numel(),
                   " elements, not 1");
  return storage_->data()[offset_];
}

std::vector<Scalar> Tensor::to_vector() const {
  Tensor c = contiguous();
  return std::vector<Scalar>(c.data(), c.data() + c.numel());
}

Tensor Tensor::reshape(const Shape& shape) const {
  require_defined("reshape");
  Shape target = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < target.rank(); ++i) {
    if (target[i] == -1) {
      TAPEFORMER_CHECK(infer < 0, "reshape: more than one -1 in ", shape);
      infer = i;
    } else {
      TAPEFORMER_CHECK(target[i] >= 0, "reshape: negative dim in ", shape);
      known *= target[i];
    }
  }
  if (infer >= 0) {
    TAPEFORMER_CHECK(known > 0 && numel() % known == 0, "reshape: cannot reshape ", shape_, " into ",
                     shape);
    target[infer] = numel() / known;
  }
  TAPEFORMER_CHECK(target.numel() == numel(), "reshape: cannot reshape ", shape_, " (", numel(),
                   " elements) into ", shape);
  Strides view;
  if (view_strides(target, &view)) return Tensor(storage_, target, view, offset_);
  Tensor base = contiguous();
  return Tensor(base.storage_, target, contiguous_strides(target), base.offset_);
}

// Strides that let `target` view this tensor's elements in row-major order, if
// any. Old dims are grouped into chunks that are contiguous among themselves;
// each chunk must be covered exactly by a run of new dims.
bool Tensor::view_strides(const Shape& target, Strides* out) const {
  if (numel() == 0 || rank() == 0) return false;
  Strides st = target;
  int view_d = target.rank() - 1;
  int64_t chunk_stride = strides_[rank() - 1];
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = rank() - 1; d >= 0; --d) {
    tensor_numel *= shape_[d];
    const bool chunk_ends =
        d == 0 || (shape_[d - 1] != 1 && strides_[d - 1] != tensor_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || target[view_d] == 1)) {
      st[view_d] = view_numel * chunk_stride;
      view_numel *= target[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return false;
    if (d > 0) {
      chunk_stride = strides_[d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return false;
  *out = st;
  return true;
}

Tensor Tensor::transpose(int a, int b) const {
  require_defined("transpose");
  a = normalize_axis(a, shape_, "transpose");
  b = normalize_axis(b, shape_, "transpose");
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::permute(const std::vector<int>& order) const {
  require_defined("permute");
  TAPEFORMER_CHECK(static_cast<int>(order.size()) == rank(), "permute: order has ", order.size(),
                   " axes for input ", shape_);
  std::vector<bool> seen(rank(), false);
  Tensor t = *this;
  for (int i = 0; i < rank(); ++i) {
    int a = normalize_axis(order[i], shape_, "permute");
    TAPEFORMER_CHECK(!seen[a], "permute: axis ", order[i], " repeated for input ", shape_);
    seen[a] = true;
    t.shape_[i] = shape_[a];
    t.strides_[i] = strides_[a];
  }
  return t;
}

Tensor Tensor::slice(int axis, int64_t start, int64_t end) const {
  require_defined("slice");
  axis = normalize_axis(axis, shape_, "slice");
  const int64_t n = shape_[axis];
  if (start < 0) start += n;
  if (end < 0) end += n;
  TAPEFORMER_CHECK(start >= 0 && start <= end && end <= n, "slice: range [", start, ", ", end,
                   ") out of bounds for axis ", axis, " of ", shape_);
  Tensor t = *this;
  t.shape_[axis] = end - start;
  t.offset_ += start * strides_[axis];
  return t;
}

Tensor Tensor::expand(const Shape& shape) const {
  require_defined("expand");
  TAPEFORMER_CHECK(shape.rank() >= rank(), "expand: cannot expand ", shape_, " to lower rank ",
                   shape);
  Strides strides = shape;
  const int lead = shape.rank() - rank();
  for (int i = 0; i < shape.rank(); ++i) {
    if (i < lead) {
      strides[i] = 0;
      continue;
    }
    const int64_t d = shape_[i - lead];
    TAPEFORMER_CHECK(d == shape[i] || d == 1, "expand: cannot expand ", shape_, " to ", shape,
                     " (dim ", i, ": ", d, " vs ", shape[i], ")");
    strides[i] = d == shape[i] ? strides_[i - lead] : 0;
  }
  return Tensor(storage_, shape, strides, offset_);
}

Tensor Tensor::unsqueeze(int axis) const {
  require_defined("unsqueeze");
  const int r = rank();
  TAPEFORMER_CHECK(axis >= -(r + 1) && axis <= r, "unsqueeze: axis ", axis,
                   " out of range for input ", shape_);
  if (axis < 0) axis += r + 1;
  Tensor t = *this;
  const int64_t stride = axis < r ? strides_[axis] * shape_[axis] : 1;
  t.shape_.insert(axis, 1);
  t.strides_.insert(axis, stride);
  return t;
}

Tensor Tensor::squeeze(int axis) const {
  require_defined("squeeze");
  axis = normalize_axis(axis, shape_, "squeeze");
  TAPEFORMER_CHECK(shape_[axis] == 1, "squeeze: dim ", axis, " of ", shape_, " is not 1");
  Tensor t = *this;
  t.shape_.erase(axis);
  t.strides_.erase(axis);
  return t;
}

Tensor Tensor::contiguous() const {
  require_defined("contiguous");
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  require_defined("clone");
  Tensor out = empty(shape_);
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  require_defined("copy_from");
  src.require_defined("copy_from");
  TAPEFORMER_CHECK(src.shape() == shape_, "copy_from: source ", src.shape(),
                   " does not match destination ", shape_);
  kernels::strided_copy(src.storage_->data() + src.offset_, src.strides_,
                        storage_->data() + offset_, strides_, shape_);
}

void Tensor::fill(Scalar value) {
  require_defined("fill");
  if (is_contiguous()) {
    std::fill(data(), data() + numel(), value);
  } else {
    copy_from(full(Shape{}, value).expand(shape_));
  }
}

IndexTensor::IndexTensor(Shape s, std::vector<int32_t> values)
    : shape(s), data(std::move(values)) {
  TAPEFORMER_CHECK(static_cast<int64_t>(data.size()) == shape.numel(), "IndexTensor: ",
                   data.size(), " values for shape ", shape);
}

std::ostream& operator<<(std::ostream& out, const Tensor& t) {
  if (!t.defined()) return out << "undefined";
  out << t.shape();
  if (!t.is_contiguous()) out << " (strided)";
  return out;
}

}  // namespace tapeformer
