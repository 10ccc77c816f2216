// A user-defined op with a hand-written backward, checked with gradcheck.
//
// softplus(x) = log(1 + e^x), d/dx = sigmoid(x). Written as a Function, it
// records itself on the tape like any built-in op.
//
//   ./build/examples/custom_op        # prints the gradcheck verdict, exits 1 on failure
#include <cstdio>

#include "tapeformer/autograd/function.h"
#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/eigen.h"
#include "tapeformer/core/kernels/elementwise.h"

using namespace tapeformer;

struct Softplus : Function {
  const char* name() const override { return "softplus"; }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    ctx.save_for_backward({in[0]});  // backward needs x only
    // log1p(e^x) overflows for large x; max(x, 0) + log1p(e^-|x|) does not.
    return {kernels::map(in[0], [](const Scalar* x, Scalar* y, int64_t n) {
      auto X = eigen::array(x, n);
      eigen::array(y, n) = X.max(0.0f) + (-X.abs()).exp().log1p();
    })};
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    // dx = dout * sigmoid(x)
    return {kernels::map2(ctx.saved()[0], dout[0], [](const Scalar* x, const Scalar* g, Scalar* o, int64_t n) {
      eigen::array(o, n) = eigen::array(g, n) / (1.0f + (-eigen::array(x, n)).exp());
    })};
  }
};

Var softplus(const Var& x) { return Function::apply<Softplus>({x})[0]; }

int main() {
  // Use it inside a bigger expression: loss = mean(softplus(x W)).
  Rng rng(0);
  Tensor x = Tensor::empty({4, 3}), w = Tensor::empty({3, 5});
  rng.fill_normal(x, 0.0f, 1.0f);
  rng.fill_normal(w, 0.0f, 1.0f);

  const GradcheckResult r = gradcheck(
      [](const std::vector<Var>& v) { return mean(softplus(matmul(v[0], v[1]))); }, {x, w},
      "mean(softplus(x W))");
  std::printf("gradcheck %s: %lld elements, max |error| %.2e %s\n", r.ok ? "passed" : "FAILED",
              static_cast<long long>(r.checked), r.max_abs_error, r.message.c_str());
  return r.ok ? 0 : 1;
}
