// Causal linear attention on log-features (core/kernels/favor.h), the kernel
// of Performer's FAVOR+: a Function whose tape keeps a, b, v, y and the row
// log-normalisers L, O(T (R + M)) per slice.
#include "autograd/function.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/kernels/favor.h"

namespace tapeformer {
namespace {

class FavorAttention : public Function {
 public:
  explicit FavorAttention(kernels::FavorShape s) : s_(s) {}
  const char* name() const override { return "favor_attention"; }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    const Tensor a = in[0].contiguous(), b = in[1].contiguous(), v = in[2].contiguous();
    Tensor y = Tensor::empty(v.shape());                         // (B, H, T, M)
    Tensor L = Tensor::empty({a.dim(0), a.dim(1), a.dim(2)});  // (B, H, T)
    kernels::favor_forward(a.data(), b.data(), v.data(), y.data(), L.data(), s_);
    ctx.save_for_backward({a, b, v, y, L});
    return {y};
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const auto& t = ctx.saved();
    const Tensor dy = dout[0].contiguous();
    Tensor da = ctx.needs_input_grad(0) ? Tensor::empty(t[0].shape()) : Tensor();
    Tensor db = ctx.needs_input_grad(1) ? Tensor::empty(t[1].shape()) : Tensor();
    Tensor dv = ctx.needs_input_grad(2) ? Tensor::empty(t[2].shape()) : Tensor();
    kernels::favor_backward(t[0].data(), t[1].data(), t[2].data(), t[3].data(), t[4].data(), dy.data(),
                            da.defined() ? da.data() : nullptr, db.defined() ? db.data() : nullptr,
                            dv.defined() ? dv.data() : nullptr, s_);
    return {da, db, dv};
  }

 private:
  kernels::FavorShape s_;
};

}  // namespace

Var favor_attention(const Var& a, const Var& b, const Var& v) {
  TAPEFORMER_CHECK(a.defined() && b.defined() && v.defined(), "favor_attention: undefined input");
  TAPEFORMER_CHECK(a.rank() == 4, "favor_attention: a must be (B, H, T, R), got ", a.shape());
  TAPEFORMER_CHECK(b.shape() == a.shape(), "favor_attention: b ", b.shape(), " must have the shape of a ", a.shape(),
                   " (B, H, T, R)");
  TAPEFORMER_CHECK(v.rank() == 4 && v.dim(0) == a.dim(0) && v.dim(1) == a.dim(1) && v.dim(2) == a.dim(2),
                   "favor_attention: v ", v.shape(), " must be (B, H, T, M) with (B, H, T) of a ", a.shape());
  return Function::apply<FavorAttention>({a, b, v},
                                         kernels::FavorShape{a.dim(0) * a.dim(1), a.dim(2), a.dim(3), v.dim(3)})[0];
}

}  // namespace tapeformer
