// The public Function API: a user-written op records itself on the tape, and
// gradcheck catches a wrong backward.
#include <doctest/doctest.h>

#include "tapeformer/autograd/function.h"
#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/eigen.h"
#include "tapeformer/core/kernels/elementwise.h"

using namespace tapeformer;

namespace {

// y = x^3, dx = 3 x^2 g (or a deliberately wrong 2 x g).
struct Cube : Function {
  explicit Cube(bool wrong = false) : wrong_(wrong) {}
  const char* name() const override { return wrong_ ? "wrong_cube" : "cube"; }
  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    ctx.save_for_backward({in[0]});
    return {kernels::map(in[0], [](const Scalar* x, Scalar* y, int64_t n) {
      eigen::array(y, n) = eigen::array(x, n).cube();
    })};
  }
  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const Scalar k = wrong_ ? 2.0f : 3.0f;
    const int power = wrong_ ? 1 : 2;
    return {kernels::map2(ctx.saved()[0], dout[0], [k, power](const Scalar* x, const Scalar* g, Scalar* o,
                                                              int64_t n) {
      eigen::array(o, n) = k * eigen::array(x, n).pow(static_cast<Scalar>(power)) * eigen::array(g, n);
    })};
  }
  bool wrong_;
};

// Two inputs, two outputs: (a + b, a * b); gradient for b is skipped when not needed.
struct SumProd : Function {
  const char* name() const override { return "sum_prod"; }
  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    ctx.save_for_backward({in[0], in[1]});
    auto plus = [](const Scalar* a, const Scalar* b, Scalar* o, int64_t n) {
      eigen::array(o, n) = eigen::array(a, n) + eigen::array(b, n);
    };
    auto times = [](const Scalar* a, const Scalar* b, Scalar* o, int64_t n) {
      eigen::array(o, n) = eigen::array(a, n) * eigen::array(b, n);
    };
    return {kernels::map2(in[0], in[1], plus), kernels::map2(in[0], in[1], times)};
  }
  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& d) override {
    const Tensor &a = ctx.saved()[0], &b = ctx.saved()[1];
    // da = d0 + d1 b, db = d0 + d1 a
    auto grad = [&](const Tensor& other) {
      return kernels::map3(d[0], d[1], other, [](const Scalar* g0, const Scalar* g1, const Scalar* o,
                                                 Scalar* r, int64_t n) {
        eigen::array(r, n) = eigen::array(g0, n) + eigen::array(g1, n) * eigen::array(o, n);
      });
    };
    return {ctx.needs_input_grad(0) ? grad(b) : Tensor(), ctx.needs_input_grad(1) ? grad(a) : Tensor()};
  }
};

Tensor sample(Shape s, uint64_t seed) {
  Tensor t = Tensor::empty(s);
  Rng(seed).fill_uniform(t, -1.5f, 1.5f);
  return t;
}

}  // namespace

TEST_CASE("a correct custom Function passes gradcheck") {
  const auto r = gradcheck([](const std::vector<Var>& v) { return Function::apply<Cube>({v[0]})[0]; },
                           {sample({3, 4}, 1)}, "cube");
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("gradcheck reports a Function with a wrong backward") {
  const auto r = gradcheck([](const std::vector<Var>& v) { return Function::apply<Cube>({v[0]}, true)[0]; },
                           {sample({3, 4}, 1)}, "wrong_cube");
  REQUIRE_FALSE(r.ok);
  // The report names the function, the input and an element, with both values.
  CHECK(r.message.find("gradcheck(wrong_cube)") != std::string::npos);
  CHECK(r.message.find("input 0 [3, 4] element (") != std::string::npos);
  CHECK(r.message.find("analytic") != std::string::npos);
  CHECK(r.message.find("numeric") != std::string::npos);
}

TEST_CASE("multi-output Function: gradients from both outputs, none for inputs that do not need it") {
  const auto r = gradcheck(
      [](const std::vector<Var>& v) {
        auto o = Function::apply<SumProd>({v[0], v[1]});
        return add(mul_scalar(o[0], 2.0f), o[1]);
      },
      {sample({4, 5}, 2), sample({4, 5}, 3)}, "sum_prod");
  CHECK_MESSAGE(r.ok, r.message);

  Var a(sample({2, 2}, 4), true), b(sample({2, 2}, 5), false);
  auto o = Function::apply<SumProd>({a, b});
  backward(sum(o[1]));  // only the product output receives a gradient
  CHECK(a.grad().to_vector() == b.value().to_vector());
  CHECK_FALSE(b.has_grad());
}

TEST_CASE("a Function on inputs that need no grad records nothing") {
  Var x(sample({2, 3}, 6), false);
  const size_t before = current_tape().size();
  Var y = Function::apply<Cube>({x})[0];
  CHECK_FALSE(y.requires_grad());
  CHECK(current_tape().size() == before);
}
