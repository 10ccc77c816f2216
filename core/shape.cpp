#include "tapeformer/core/shape.h"

#include <algorithm>
#include <ostream>
#include <sstream>

#include "tapeformer/core/error.h"

namespace tapeformer {

Dims::Dims(std::initializer_list<int64_t> dims) : Dims(std::vector<int64_t>(dims)) {}

Dims::Dims(const std::vector<int64_t>& dims) {
  TAPEFORMER_CHECK(dims.size() <= static_cast<size_t>(kMaxRank), "Shape: rank ", dims.size(),
                   " exceeds the maximum rank ", kMaxRank);
  for (int64_t v : dims) push_back(v);
}

int Dims::wrap(int i) const {
  int j = i < 0 ? i + rank_ : i;
  TAPEFORMER_CHECK(j >= 0 && j < rank_, "Shape: index ", i, " out of range for ", *this);
  return j;
}

void Dims::push_back(int64_t v) {
  TAPEFORMER_CHECK(rank_ < kMaxRank, "Shape: rank would exceed the maximum rank ", kMaxRank);
  d_[rank_++] = v;
}

void Dims::insert(int pos, int64_t v) {
  TAPEFORMER_CHECK(pos >= 0 && pos <= rank_, "Shape: insert position ", pos, " out of range for ",
                   *this);
  push_back(0);
  for (int i = rank_ - 1; i > pos; --i) d_[i] = d_[i - 1];
  d_[pos] = v;
}

void Dims::erase(int pos) {
  pos = wrap(pos);
  for (int i = pos; i + 1 < rank_; ++i) d_[i] = d_[i + 1];
  --rank_;
}

int64_t Dims::numel() const {
  int64_t n = 1;
  for (int64_t v : *this) {
    if (__builtin_mul_overflow(n, v, &n)) fail("shape ", *this, " has more elements than fit in 64 bits");
  }
  return n;
}

std::string Dims::str() const {
  std::ostringstream out;
  out << *this;
  return out.str();
}

bool operator==(const Dims& a, const Dims& b) {
  return a.rank_ == b.rank_ && std::equal(a.begin(), a.end(), b.begin());
}

std::ostream& operator<<(std::ostream& out, const Dims& d) {
  out << '[';
  for (int i = 0; i < d.rank(); ++i) out << (i ? ", " : "") << d[i];
  return out << ']';
}

Strides contiguous_strides(const Shape& shape) {
  Strides s = shape;
  int64_t acc = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

int normalize_axis(int axis, const Shape& shape, const char* op) {
  const int r = shape.rank();
  TAPEFORMER_CHECK(axis >= -r && axis < r, op, ": axis ", axis, " out of range for rank ", r,
                   " input ", shape);
  return axis < 0 ? axis + r : axis;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const int r = std::max(a.rank(), b.rank());
  std::vector<int64_t> out(r);
  for (int i = 0; i < r; ++i) {
    const int ia = a.rank() - r + i, ib = b.rank() - r + i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    TAPEFORMER_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b,
                     " do not broadcast (dim ", i - r, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return Shape(out);
}

}  // namespace tapeformer
