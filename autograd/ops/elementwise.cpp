// Elementwise ops: forward, then the backward closure right below it.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/eigen.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/activation.h"
#include "tapeformer/core/kernels/elementwise.h"
#include "tapeformer/core/kernels/reduce.h"
#include "tapeformer/core/kernels/vector_loops.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/profile.h"
#include "tapeformer/core/rng.h"

namespace tapeformer {
namespace {

using eigen::array;
using kernels::map;
using kernels::map2;
using kernels::map3;

// Broadcasts a and b to their common shape through the explicit expand op.
std::pair<Var, Var> broadcast(const Var& a, const Var& b, const char* op) {
  TAPEFORMER_CHECK(a.defined() && b.defined(), op, ": undefined input");
  const Shape s = broadcast_shapes(a.shape(), b.shape(), op);
  return {expand(a, s), expand(b, s)};
}

Var unary_result(const Var& x, Tensor y, const char* op) {
  TAPEFORMER_CHECK(x.defined(), op, ": undefined input");
  return make_result(std::move(y), {&x});
}

}  // namespace

Var expand(const Var& x, const Shape& shape) {
  TAPEFORMER_CHECK(x.defined(), "expand: undefined input");
  if (x.shape() == shape) return x;
  Var out = make_result(x.value().expand(shape), {&x});
  record_backward(out, [x](const Tensor& g) {
    accumulate_grad(x, kernels::sum_to(g, x.shape()), "expand");
  });
  return out;
}

Var sum_to(const Var& x, const Shape& shape) {
  TAPEFORMER_CHECK(x.defined(), "sum_to: undefined input");
  // Valid only when `shape` broadcasts to x's shape.
  TAPEFORMER_CHECK(broadcast_shapes(shape, x.shape(), "sum_to") == x.shape(), "sum_to: ", shape,
                   " does not broadcast to input ", x.shape());
  if (x.shape() == shape) return x;
  Var out = make_result(kernels::sum_to(x.value(), shape), {&x});
  record_backward(out, [x](const Tensor& g) {
    accumulate_grad(x, g.expand(x.shape()).contiguous(), "sum_to");
  });
  return out;
}

Var add(const Var& a_in, const Var& b_in) {
  Var a, b;  // not a structured binding: C++17 lambdas cannot capture those
  std::tie(a, b) = broadcast(a_in, b_in, "add");
  Var out = make_result(map2(a.value(), b.value(), [](const Scalar* x, const Scalar* y, Scalar* o,
                                                      int64_t n) { array(o, n) = array(x, n) + array(y, n); }),
                        {&a, &b});
  record_backward(out, [a, b](const Tensor& g) {
    accumulate_grad(a, g, "add");
    accumulate_grad(b, g, "add");
  });
  return out;
}

Var sub(const Var& a_in, const Var& b_in) {
  Var a, b;
  std::tie(a, b) = broadcast(a_in, b_in, "sub");
  Var out = make_result(map2(a.value(), b.value(), [](const Scalar* x, const Scalar* y, Scalar* o,
                                                      int64_t n) { array(o, n) = array(x, n) - array(y, n); }),
                        {&a, &b});
  record_backward(out, [a, b](const Tensor& g) {
    accumulate_grad(a, g, "sub");
    if (b.requires_grad())
      accumulate_grad(b, map(g, [](const Scalar* x, Scalar* o, int64_t n) { array(o, n) = -array(x, n); }),
                      "sub");
  });
  return out;
}

Var mul(const Var& a_in, const Var& b_in) {
  Var a, b;
  std::tie(a, b) = broadcast(a_in, b_in, "mul");
  const auto times = [](const Scalar* x, const Scalar* y, Scalar* o, int64_t n) {
    array(o, n) = array(x, n) * array(y, n);
  };
  Var out = make_result(map2(a.value(), b.value(), times), {&a, &b});
  record_backward(out, [a, b, times](const Tensor& g) {
    if (a.requires_grad()) accumulate_grad(a, map2(g, b.value(), times), "mul");
    if (b.requires_grad()) accumulate_grad(b, map2(g, a.value(), times), "mul");
  });
  return out;
}

Var div(const Var& a_in, const Var& b_in) {
  Var a, b;
  std::tie(a, b) = broadcast(a_in, b_in, "div");
  Var out = make_result(map2(a.value(), b.value(), [](const Scalar* x, const Scalar* y, Scalar* o,
                                                      int64_t n) { array(o, n) = array(x, n) / array(y, n); }),
                        {&a, &b});
  record_backward(out, [a, b](const Tensor& g) {
    if (a.requires_grad())
      accumulate_grad(a, map2(g, b.value(), [](const Scalar* g, const Scalar* y, Scalar* o, int64_t n) {
                        array(o, n) = array(g, n) / array(y, n);
                      }), "div");
    if (b.requires_grad())
      accumulate_grad(b, map3(g, a.value(), b.value(), [](const Scalar* g, const Scalar* x, const Scalar* y,
                                                           Scalar* o, int64_t n) {
                        array(o, n) = -array(g, n) * array(x, n) / array(y, n).square();
                      }), "div");
  });
  return out;
}

Var neg(const Var& x) { return mul_scalar(x, -1.0f); }

Var add_scalar(const Var& x, Scalar s) {
  Var out = unary_result(x, map(x.value(), [s](const Scalar* v, Scalar* o, int64_t n) {
                           array(o, n) = array(v, n) + s;
                         }), "add_scalar");
  record_backward(out, [x](const Tensor& g) { accumulate_grad(x, g, "add_scalar"); });
  return out;
}

Var mul_scalar(const Var& x, Scalar s) {
  const auto scale = [s](const Scalar* v, Scalar* o, int64_t n) { array(o, n) = array(v, n) * s; };
  Var out = unary_result(x, map(x.value(), scale), "mul_scalar");
  record_backward(out, [x, scale](const Tensor& g) { accumulate_grad(x, map(g, scale), "mul_scalar"); });
  return out;
}

// Records dx = g * deriv(x, y) for a unary op y = f(x); deriv maps Eigen arrays.
template <class Deriv>
void record_unary_backward(const Var& out, const Var& x, const Tensor& y, const char* op, Deriv deriv) {
  record_backward(out, [x, y, op, deriv](const Tensor& g) {
    accumulate_grad(x, map3(g, x.value(), y, [&deriv](const Scalar* gp, const Scalar* xp,
                                                      const Scalar* yp, Scalar* o, int64_t n) {
                      array(o, n) = array(gp, n) * deriv(array(xp, n), array(yp, n));
                    }), op);
  });
}

Var exp(const Var& x) {
  // The packet exp for every element (Eigen's maps send a row's unaligned
  // ends through libm's expf): the same bits on every instruction set.
  Tensor y = map(x.value(), [](const Scalar* v, Scalar* o, int64_t n) {
    kernels::vec::map(v, o, n, [](const eigen::Packet& p) { return eigen::exp(p); });
  });
  Var out = unary_result(x, y, "exp");
  record_unary_backward(out, x, y, "exp", [](const auto& X, const auto& Y) { return Y; });
  return out;
}

Var log(const Var& x) {
  Tensor y = map(x.value(), [](const Scalar* v, Scalar* o, int64_t n) {
    kernels::vec::map(v, o, n, [](const eigen::Packet& p) { return eigen::log(p); });
  });
  Var out = unary_result(x, y, "log");
  record_unary_backward(out, x, y, "log", [](const auto& X, const auto& Y) { return X.inverse(); });
  return out;
}

Var sqrt(const Var& x) {
  Tensor y = map(x.value(), [](const Scalar* v, Scalar* o, int64_t n) { array(o, n) = array(v, n).sqrt(); });
  Var out = unary_result(x, y, "sqrt");
  record_unary_backward(out, x, y, "sqrt", [](const auto& X, const auto& Y) { return 0.5f * Y.inverse(); });
  return out;
}

Var pow(const Var& x, Scalar p) {
  // libm's powf per element (Eigen vectorises pow with its own polynomial,
  // whose bits depend on the width).
  Tensor y = map(x.value(), [p](const Scalar* v, Scalar* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) o[i] = std::pow(v[i], p);
  });
  Var out = unary_result(x, y, "pow");
  record_backward(out, [x, p](const Tensor& g) {
    accumulate_grad(x, map2(g, x.value(), [p](const Scalar* gp, const Scalar* xp, Scalar* o, int64_t n) {
                      for (int64_t i = 0; i < n; ++i) o[i] = gp[i] * p * std::pow(xp[i], p - 1);
                    }), "pow");
  });
  return out;
}

Var tanh(const Var& x) {
  Tensor y = map(x.value(), [](const Scalar* v, Scalar* o, int64_t n) {
    kernels::vec::map(v, o, n, [](const eigen::Packet& p) { return eigen::tanh(p); });
  });
  Var out = unary_result(x, y, "tanh");
  record_unary_backward(out, x, y, "tanh", [](const auto& X, const auto& Y) { return 1.0f - Y.square(); });
  return out;
}

Var sigmoid(const Var& x) {
  Tensor y = map(x.value(), [](const Scalar* v, Scalar* o, int64_t n) {
    using namespace Eigen::internal;
    const eigen::Packet one = pset1<eigen::Packet>(1.0f);
    kernels::vec::map(v, o, n, [&](const eigen::Packet& p) { return pdiv(one, padd(one, eigen::exp(pnegate(p)))); });
  });
  Var out = unary_result(x, y, "sigmoid");
  record_unary_backward(out, x, y, "sigmoid", [](const auto& X, const auto& Y) { return Y * (1.0f - Y); });
  return out;
}

namespace {
// y = act(x) with the derivative act'(x) kept for the backward (see
// core/kernels/activation.h): the backward is one multiply.
Var activation(const Var& x, Activation act, const char* name) {
  TAPEFORMER_CHECK(x.defined(), name, ": undefined input");
  Tensor y = x.value().clone();  // activated in place
  const bool grad = grad_enabled() && x.requires_grad();
  Tensor dydx = grad ? Tensor::empty(y.shape()) : Tensor();
  Scalar* yp = y.data();
  Scalar* dp = grad ? dydx.data() : nullptr;
  parallel::parallel_for(y.numel(), kernels::kElementwiseGrain, [&](int64_t b, int64_t e) {
    kernels::activate_rows(act, yp + b, dp ? dp + b : nullptr, e - b);
  });
  Var out = unary_result(x, y, name);
  record_backward(out, [x, dydx, name](const Tensor& g) {
    accumulate_grad(x, map2(g, dydx, [](const Scalar* gp, const Scalar* dp, Scalar* o, int64_t n) {
                      array(o, n) = array(gp, n) * array(dp, n);
                    }), name);
  });
  return out;
}
}  // namespace

Var relu(const Var& x) { return activation(x, Activation::Relu, "relu"); }

Var gelu(const Var& x) { return activation(x, Activation::Gelu, "gelu"); }

Var silu(const Var& x) { return activation(x, Activation::Silu, "silu"); }

Var elu(const Var& x, Scalar alpha) {
  Tensor y = map(x.value(), [alpha](const Scalar* v, Scalar* o, int64_t n) {
    // max(x, 0) + a (e^min(x, 0) - 1): the same values as the two-branch
    // select, with the packet exp for every element.
    using namespace Eigen::internal;
    const eigen::Packet zero = pset1<eigen::Packet>(0.0f), one = pset1<eigen::Packet>(1.0f),
                        a = pset1<eigen::Packet>(alpha);
    kernels::vec::map(v, o, n, [&](const eigen::Packet& p) {
      return padd(pmax(p, zero), pmul(a, psub(eigen::exp(pmin(p, zero)), one)));
    });
  });
  Var out = unary_result(x, y, "elu");
  record_backward(out, [x, y, alpha](const Tensor& g) {
    accumulate_grad(x, map3(g, x.value(), y, [alpha](const Scalar* gp, const Scalar* xp, const Scalar* yp,
                                                     Scalar* o, int64_t n) {
                      auto X = array(xp, n);
                      array(o, n) = array(gp, n) * (X > 0.0f).select(1.0f, array(yp, n) + alpha);
                    }), "elu");
  });
  return out;
}

Var where(const Tensor& cond_in, const Var& a_in, const Var& b_in) {
  TAPEFORMER_CHECK(cond_in.defined(), "where: undefined condition");
  auto [a0, b0] = broadcast(a_in, b_in, "where");
  const Shape s = broadcast_shapes(cond_in.shape(), a0.shape(), "where");
  const Var a = expand(a0, s), b = expand(b0, s);
  const Tensor cond = cond_in.expand(s).contiguous();
  Var out = make_result(map3(cond, a.value(), b.value(), [](const Scalar* c, const Scalar* x, const Scalar* y,
                                                            Scalar* o, int64_t n) {
                          array(o, n) = (array(c, n) != 0.0f).select(array(x, n), array(y, n));
                        }), {&a, &b});
  record_backward(out, [a, b, cond](const Tensor& g) {
    const auto pick = [](bool take_true) {
      return [take_true](const Scalar* c, const Scalar* gp, Scalar* o, int64_t n) {
        array(o, n) = ((array(c, n) != 0.0f) == take_true).select(array(gp, n), 0.0f);
      };
    };
    if (a.requires_grad()) accumulate_grad(a, map2(cond, g, pick(true)), "where");
    if (b.requires_grad()) accumulate_grad(b, map2(cond, g, pick(false)), "where");
  });
  return out;
}

Var masked_fill(const Var& x, const Tensor& mask_in, Scalar value) {
  TAPEFORMER_CHECK(x.defined() && mask_in.defined(), "masked_fill: undefined input");
  TAPEFORMER_CHECK(broadcast_shapes(mask_in.shape(), x.shape(), "masked_fill") == x.shape(),
                   "masked_fill: mask ", mask_in.shape(), " does not broadcast to input ", x.shape());
  const Tensor mask = mask_in.expand(x.shape()).contiguous();
  Var out = make_result(map2(mask, x.value(), [value](const Scalar* m, const Scalar* v, Scalar* o, int64_t n) {
                          array(o, n) = (array(m, n) != 0.0f).select(value, array(v, n));
                        }), {&x});
  record_backward(out, [x, mask](const Tensor& g) {
    accumulate_grad(x, map2(mask, g, [](const Scalar* m, const Scalar* gp, Scalar* o, int64_t n) {
                      array(o, n) = (array(m, n) != 0.0f).select(0.0f, array(gp, n));
                    }), "masked_fill");
  });
  return out;
}

namespace {

// y = x * m / (1 - p) with m the DropoutMask of `seed` (core/rng.h): the mask Rng::fill_dropout_mask
// would write, applied on the fly, so the backward regenerates it instead of storing it.
Tensor apply_dropout_mask(const Tensor& x, Scalar p, uint64_t seed) {
  const profile::Scope timed("elementwise");
  const Tensor in = x.contiguous();
  TAPEFORMER_CHECK(in.numel() < (int64_t{1} << 32), "dropout: ", in.numel(), " elements, more than its mask's 2^32 - 1");
  Tensor out = Tensor::empty(in.shape());
  const DropoutMask mask(seed, p);
  const Scalar* a = in.data();
  Scalar* o = out.data();
  parallel::parallel_for(in.numel(), 1 << 14, [&](int64_t i0, int64_t i1) {
    for (auto i = static_cast<uint32_t>(i0); i < static_cast<uint32_t>(i1); ++i)
      o[i] = mask.keeps(i) ? a[i] * mask.scale : 0.0f;
  });
  return out;
}

}  // namespace

Var dropout(const Var& x, Scalar p, Rng& rng) {
  TAPEFORMER_CHECK(x.defined(), "dropout: undefined input");
  TAPEFORMER_CHECK(p >= 0.0f && p < 1.0f, "dropout: probability ", p, " is not in [0, 1)");
  if (p == 0.0f) return x;
  const uint64_t seed = rng.next_u64();
  Var out = make_result(apply_dropout_mask(x.value(), p, seed), {&x});
  record_backward(out, [x, p, seed](const Tensor& g) { accumulate_grad(x, apply_dropout_mask(g, p, seed), "dropout"); });
  return out;
}

}  // namespace tapeformer
