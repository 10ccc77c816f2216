// Tensor: a float32 n-d array = shared Storage + shape + strides + offset.
//
//   Tensor x = Tensor::zeros({2, 3});
//   Tensor t = x.transpose(0, 1);         // [3, 2] view, shares storage
//   Tensor c = t.contiguous();             // row-major copy
//   Tensor b = Tensor::from({2, 2}, {1, 2, 3, 4});
//
// Views (reshape of a contiguous tensor, transpose, permute, slice, expand)
// never copy. Kernels take contiguous inputs; they call contiguous() (a no-op
// for contiguous tensors) where they must. Copying a tensor handle is cheap
// and aliases the data; use clone() for a deep copy.
#pragma once

#include <initializer_list>
#include <memory>
#include <vector>

#include "tapeformer/core/shape.h"
#include "tapeformer/core/storage.h"

namespace tapeformer {

class Tensor {
 public:
  Tensor() = default;  // undefined tensor: defined() == false

  // ---- factories ----
  static Tensor empty(const Shape& shape);  // uninitialised, contiguous
  // A contiguous tensor of `shape` over storage's floats from `offset` (a
  // Storage::borrow of shared memory); Error when they do not fit.
  static Tensor over(std::shared_ptr<Storage> storage, const Shape& shape, int64_t offset = 0);
  static Tensor zeros(const Shape& shape);
  static Tensor ones(const Shape& shape);
  static Tensor full(const Shape& shape, Scalar value);
  static Tensor scalar(Scalar value);  // rank-0 tensor
  // Copies `values` (row-major); throws when values.size() != shape.numel().
  static Tensor from(const Shape& shape, const std::vector<Scalar>& values);
  // 0, 1, ..., n-1 as a [n] tensor.
  static Tensor arange(int64_t n);

  // ---- inspection ----
  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  bool is_contiguous() const;
  // True when this tensor and `other` share the same Storage.
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Pointer to element 0 (at offset). Only meaningful for contiguous
  // tensors when read as a flat array.
  Scalar* data();
  const Scalar* data() const;

  // Element access by full index (slow; for tests and small code).
  Scalar at(std::initializer_list<int64_t> index) const;
  Scalar& at(std::initializer_list<int64_t> index);
  // The value of a one-element tensor.
  Scalar item() const;
  // Row-major copy of the elements.
  std::vector<Scalar> to_vector() const;

  // ---- views (share storage) ----
  // Reshape; one dim may be -1. A view whenever the strides allow it (always
  // for contiguous tensors), otherwise a contiguous copy.
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int a, int b) const;
  Tensor permute(const std::vector<int>& order) const;
  // Elements [start, end) along axis (negative start/end count from the end).
  Tensor slice(int axis, int64_t start, int64_t end) const;
  // Broadcast to `shape` with stride-0 dims (numpy rules, size-1 dims only).
  Tensor expand(const Shape& shape) const;
  // Inserts / removes a size-1 dim.
  Tensor unsqueeze(int axis) const;
  Tensor squeeze(int axis) const;

  // ---- copies ----
  Tensor contiguous() const;  // self when already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  // The shape without the elements: undefined (defined() is false, data()
  // throws), its storage let go. For a value dropped and rebuilt later.
  Tensor shape_only() const;
  // Copies src's elements into this tensor (shapes must match; this may be strided).
  void copy_from(const Tensor& src);
  void fill(Scalar value);

 private:
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset);
  void require_defined(const char* op) const;
  bool view_strides(const Shape& target, Strides* out) const;

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Strides strides_;
  int64_t offset_ = 0;
};

// Integer tensor for token ids and class targets (embedding, cross_entropy).
struct IndexTensor {
  Shape shape;
  std::vector<int32_t> data;  // row-major, size shape.numel()

  IndexTensor() = default;
  IndexTensor(Shape s, std::vector<int32_t> values);
  int64_t numel() const { return shape.numel(); }
};

// Pretty/short description for error messages: "[2, 3] (strided)".
std::ostream& operator<<(std::ostream& out, const Tensor& t);

}  // namespace tapeformer
