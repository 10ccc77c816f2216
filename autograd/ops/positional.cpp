// Positional ops: RoPE's rotation and Shaw et al.'s clipped relative gather /
// scatter-add (docs/math.md#positional-schemes). Each is its own adjoint's partner: the rotation's
// backward is the rotation by the opposite angle, the gather's backward is the
// scatter-add and vice versa.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"

namespace tapeformer {
namespace {

// x (..., T, ..., D) as [outer][T][inner][D] around the position axis.
struct PositionLayout {
  int64_t outer = 1, T = 1, inner = 1, D = 1;
};

PositionLayout position_layout(const Shape& s, int axis) {
  PositionLayout l;
  l.T = s[axis];
  l.D = s[-1];
  for (int d = 0; d < axis; ++d) l.outer *= s[d];
  for (int d = axis + 1; d < s.rank() - 1; ++d) l.inner *= s[d];
  return l;
}

// cos and sin of (start + t) * base^(-2k / (2 floor(D / 2))), (T, D / 2) each.
// Angles in double: at position 10^5 a float angle would be off by ~0.01 rad.
void rotation_table(int64_t T, int64_t D, int64_t start, Scalar base, std::vector<Scalar>& cos_t,
                    std::vector<Scalar>& sin_t) {
  const int64_t pairs = D / 2;
  cos_t.resize(static_cast<size_t>(T * pairs));
  sin_t.resize(cos_t.size());
  for (int64_t k = 0; k < pairs; ++k) {
    const double theta = std::pow(static_cast<double>(base), -2.0 * static_cast<double>(k) / (2.0 * pairs));
    for (int64_t t = 0; t < T; ++t) {
      const double angle = static_cast<double>(start + t) * theta;
      cos_t[t * pairs + k] = static_cast<Scalar>(std::cos(angle));
      sin_t[t * pairs + k] = static_cast<Scalar>(std::sin(angle));
    }
  }
}

// y = x rotated pair by pair by +angle (sign = 1) or -angle (sign = -1).
Tensor rotate(const Tensor& x_in, const PositionLayout& l, const std::vector<Scalar>& cos_t,
              const std::vector<Scalar>& sin_t, Scalar sign) {
  const Tensor x = x_in.contiguous();
  Tensor y = Tensor::empty(x.shape());
  const Scalar* src = x.data();
  Scalar* dst = y.data();
  const int64_t pairs = l.D / 2;
  parallel::parallel_for(l.outer * l.T, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % l.T;
      const Scalar* c = cos_t.data() + t * pairs;
      const Scalar* s = sin_t.data() + t * pairs;
      for (int64_t m = 0; m < l.inner; ++m) {
        const Scalar* xi = src + (r * l.inner + m) * l.D;
        Scalar* yi = dst + (r * l.inner + m) * l.D;
        for (int64_t k = 0; k < pairs; ++k) {
          const Scalar x0 = xi[2 * k], x1 = xi[2 * k + 1], sn = sign * s[k];
          yi[2 * k] = x0 * c[k] - x1 * sn;
          yi[2 * k + 1] = x0 * sn + x1 * c[k];
        }
        if (l.D % 2 == 1) yi[l.D - 1] = xi[l.D - 1];  // an odd last component is not rotated
      }
    }
  });
  return y;
}

// Offset column of (i, j): clamp(k_start + j - q_start - i, -K, K) + K.
struct RelativeOffsets {
  int64_t K, q_start, k_start;
  int64_t column(int64_t i, int64_t j) const {
    return std::clamp<int64_t>(k_start + j - q_start - i, -K, K) + K;
  }
};

// Rows of the last two dims: x (..., R, N) as `rows` rows of N.
int64_t leading_rows(const Shape& s) { return s.numel() / std::max<int64_t>(1, s[-1]); }

// y (..., Tq, Tk)[i, j] = r (..., Tq, 2K + 1)[i, column(i, j)]
Tensor gather(const Tensor& r_in, int64_t Tk, const RelativeOffsets& o) {
  const Tensor r = r_in.contiguous();
  Shape out_shape = r.shape();
  out_shape[-1] = Tk;
  Tensor y = Tensor::empty(out_shape);
  const int64_t Tq = r.dim(-2), W = 2 * o.K + 1;
  const Scalar* src = r.data();
  Scalar* dst = y.data();
  parallel::parallel_for(leading_rows(r.shape()), 64, [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t i = row % Tq;
      for (int64_t j = 0; j < Tk; ++j) dst[row * Tk + j] = src[row * W + o.column(i, j)];
    }
  });
  return y;
}

// y (..., Tq, 2K + 1)[i, c] = sum over j with column(i, j) == c of p (..., Tq, Tk)[i, j]
Tensor scatter(const Tensor& p_in, const RelativeOffsets& o) {
  const Tensor p = p_in.contiguous();
  Shape out_shape = p.shape();
  const int64_t W = 2 * o.K + 1, Tq = p.dim(-2), Tk = p.dim(-1);
  out_shape[-1] = W;
  Tensor y = Tensor::zeros(out_shape);
  const Scalar* src = p.data();
  Scalar* dst = y.data();
  parallel::parallel_for(leading_rows(p.shape()), 64, [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t i = row % Tq;
      for (int64_t j = 0; j < Tk; ++j) dst[row * W + o.column(i, j)] += src[row * Tk + j];
    }
  });
  return y;
}

void check_relative(const Shape& s, const char* op, const char* what) {
  TAPEFORMER_CHECK(s.rank() >= 2, op, ": ", what, " must be (..., Tq, N), got ", s);
}

}  // namespace

Var rotary(const Var& x, int axis, int64_t start, Scalar base) {
  TAPEFORMER_CHECK(x.defined(), "rotary: undefined input");
  const Shape& s = x.shape();
  TAPEFORMER_CHECK(s.rank() >= 2, "rotary: x must have a position axis and a feature axis, got ", s);
  const int a = axis < 0 ? axis + s.rank() : axis;
  TAPEFORMER_CHECK(a >= 0 && a < s.rank() - 1, "rotary: position axis ", axis,
                   " must be one of the first ", s.rank() - 1, " axes of x ", s, " (the last holds the features)");
  TAPEFORMER_CHECK(start >= 0, "rotary: start position must be >= 0, got ", start);
  TAPEFORMER_CHECK(base > 1 && std::isfinite(base), "rotary: base must be a finite number > 1, got ", base);
  const PositionLayout l = position_layout(s, a);
  std::vector<Scalar> cos_t, sin_t;
  rotation_table(l.T, l.D, start, base, cos_t, sin_t);
  Var out = make_result(rotate(x.value(), l, cos_t, sin_t, 1.0f), {&x});
  record_backward(out, [x, l, cos_t = std::move(cos_t), sin_t = std::move(sin_t)](const Tensor& g) {
    accumulate_grad(x, rotate(g, l, cos_t, sin_t, -1.0f), "rotary");  // R(-a) = R(a)^T
  });
  return out;
}

Var relative_gather(const Var& r, int64_t Tk, int64_t q_start, int64_t k_start) {
  TAPEFORMER_CHECK(r.defined(), "relative_gather: undefined input");
  check_relative(r.shape(), "relative_gather", "r");
  const int64_t W = r.dim(-1);
  TAPEFORMER_CHECK(W % 2 == 1, "relative_gather: r ", r.shape(), " must hold 2K + 1 offset columns (an odd count)");
  TAPEFORMER_CHECK(Tk >= 1, "relative_gather: Tk must be >= 1, got ", Tk);
  TAPEFORMER_CHECK(q_start >= 0 && k_start >= 0, "relative_gather: start positions must be >= 0, got q_start ",
                   q_start, ", k_start ", k_start);
  const RelativeOffsets o{(W - 1) / 2, q_start, k_start};
  Var out = make_result(gather(r.value(), Tk, o), {&r});
  record_backward(out, [r, o](const Tensor& g) { accumulate_grad(r, scatter(g, o), "relative_gather"); });
  return out;
}

Var relative_scatter(const Var& p, int64_t K, int64_t q_start, int64_t k_start) {
  TAPEFORMER_CHECK(p.defined(), "relative_scatter: undefined input");
  check_relative(p.shape(), "relative_scatter", "p");
  TAPEFORMER_CHECK(K >= 0, "relative_scatter: clip distance K must be >= 0, got ", K);
  TAPEFORMER_CHECK(q_start >= 0 && k_start >= 0, "relative_scatter: start positions must be >= 0, got q_start ",
                   q_start, ", k_start ", k_start);
  const RelativeOffsets o{K, q_start, k_start};
  const int64_t Tk = p.dim(-1);
  Var out = make_result(scatter(p.value(), o), {&p});
  record_backward(out, [p, o, Tk](const Tensor& g) { accumulate_grad(p, gather(g, Tk, o), "relative_scatter"); });
  return out;
}

}  // namespace tapeformer
