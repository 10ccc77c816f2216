// Shape: the dims of a tensor as a small inline vector (rank <= kMaxRank).
//
//   Shape s{2, 3, 4};   // prints as [2, 3, 4]
//   s.numel() == 24; s[-1] == 4; s.rank() == 3
//
// Negative indices count from the end, as in PyTorch. Strides use the same
// container (`Strides`), counted in elements.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <string>
#include <vector>

namespace tapeformer {

inline constexpr int kMaxRank = 6;

class Dims {
 public:
  Dims() = default;
  Dims(std::initializer_list<int64_t> dims);
  explicit Dims(const std::vector<int64_t>& dims);

  int rank() const { return rank_; }
  bool empty() const { return rank_ == 0; }
  // i may be negative (counts from the end); throws Error when out of range.
  int64_t operator[](int i) const { return d_[wrap(i)]; }
  int64_t& operator[](int i) { return d_[wrap(i)]; }
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + rank_; }
  void push_back(int64_t v);
  void insert(int pos, int64_t v);
  void erase(int pos);
  std::vector<int64_t> to_vector() const { return {begin(), end()}; }

  // Product of the dims (1 for rank 0).
  int64_t numel() const;
  std::string str() const;

  friend bool operator==(const Dims& a, const Dims& b);
  friend bool operator!=(const Dims& a, const Dims& b) { return !(a == b); }

 private:
  int wrap(int i) const;
  std::array<int64_t, kMaxRank> d_{};
  int rank_ = 0;
};

using Shape = Dims;
using Strides = Dims;

std::ostream& operator<<(std::ostream& out, const Dims& d);

// Row-major (C order) strides of a shape.
Strides contiguous_strides(const Shape& shape);

// Maps a possibly negative axis into [0, rank). Throws Error naming `op` and
// the shape when the axis is out of range.
int normalize_axis(int axis, const Shape& shape, const char* op);

// numpy broadcasting of two shapes (size-1 rule, aligned from the right).
// Throws Error naming `op` and both shapes when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace tapeformer
