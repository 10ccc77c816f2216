// Linear-attention ops (docs/math.md#linear-attention): the causal product, kernelised linear
// attention, efficient attention, and FAVOR+'s causal linear attention on
// log-features (core/kernels/favor.h, whose tape keeps a, b, v, y and the row
// log-normalisers L). The causal forms are Functions with hand-written
// backward passes that save O(T (C + M)) per slice; non-causal efficient
// attention is composed of ops.
#include <cmath>
#include <functional>

#include "tapeformer/autograd/function.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/favor.h"
#include "tapeformer/core/kernels/linear_attention.h"

namespace tapeformer {
namespace {

// Checks a, b (B, H, T, C) and v (B, H, T, M); an, bn name a and b in messages.
kernels::LinearAttentionShape check_inputs(const char* op, const char* an, const char* bn, const Var& a,
                                           const Var& b, const Var& v) {
  TAPEFORMER_CHECK(a.defined() && b.defined() && v.defined(), op, ": undefined input");
  TAPEFORMER_CHECK(a.rank() == 4, op, ": ", an, " must be (B, H, T, C), got ", a.shape());
  TAPEFORMER_CHECK(b.shape() == a.shape(), op, ": ", bn, " ", b.shape(), " must have the shape of ", an, " ",
                   a.shape(), " (B, H, T, C)");
  TAPEFORMER_CHECK(v.rank() == 4 && v.dim(0) == a.dim(0) && v.dim(1) == a.dim(1) && v.dim(2) == a.dim(2), op,
                   ": v ", v.shape(), " must be (B, H, T, M) with (B, H, T) of ", an, " ", a.shape());
  return {a.dim(0) * a.dim(1), a.dim(2), a.dim(3), v.dim(3)};
}

// The frame the four causal ops share, each a Function over inputs a, b
// (B, H, T, C) and v (B, H, T, M), made contiguous, to y (B, H, T, M) with a
// hand-written backward to da, db, dv. An op gives its two kernel calls over
// row-major pointers (Forward, Backward). The tape keeps a, b, v, and with
// `rows` also y and a statistic per row (B, H, T) that the forward writes
// (the denominators, FAVOR+'s log-normalisers).
class KernelFunction : public Function {
 public:
  struct Forward {
    const Scalar *a, *b, *v;
    Scalar* y;
    Scalar* rows;  // (B, H, T), or null without `rows`
  };
  struct Backward {
    const Scalar *a, *b, *v, *y, *rows;  // y and rows null without `rows`
    const Scalar* dy;
    Scalar *da, *db, *dv;  // null for an input that needs no gradient, with `skips_unneeded`
  };
  struct Layout {
    bool rows = false;            // the forward writes a per-row statistic, kept with y for the backward
    bool skips_unneeded = false;  // the backward kernel skips a null gradient
  };

  KernelFunction(const char* name, Layout layout, std::function<void(const Forward&)> forward,
                 std::function<void(const Backward&)> backward)
      : name_(name), layout_(layout), forward_(std::move(forward)), backward_(std::move(backward)) {}
  const char* name() const override { return name_; }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    const Tensor a = in[0].contiguous(), b = in[1].contiguous(), v = in[2].contiguous();
    Tensor y = Tensor::empty(v.shape());                                                      // (B, H, T, M)
    Tensor rows = layout_.rows ? Tensor::empty({a.dim(0), a.dim(1), a.dim(2)}) : Tensor();  // (B, H, T)
    forward_({a.data(), b.data(), v.data(), y.data(), layout_.rows ? rows.data() : nullptr});
    if (layout_.rows) {
      ctx.save_for_backward({a, b, v, y, rows});
    } else {
      ctx.save_for_backward({a, b, v});
    }
    return {y};
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const std::vector<Tensor>& t = ctx.saved();
    const Tensor dy = dout[0].contiguous();
    std::vector<Tensor> grads(3);  // da, db, dv
    for (size_t i = 0; i < 3; ++i)
      if (!layout_.skips_unneeded || ctx.needs_input_grad(i)) grads[i] = Tensor::empty(t[i].shape());
    const auto data = [](Tensor& g) { return g.defined() ? g.data() : nullptr; };
    const Scalar* y = layout_.rows ? t[3].data() : nullptr;
    const Scalar* rows = layout_.rows ? t[4].data() : nullptr;
    backward_({t[0].data(), t[1].data(), t[2].data(), y, rows, dy.data(), data(grads[0]), data(grads[1]),
               data(grads[2])});
    return grads;
  }

 private:
  const char* name_;
  Layout layout_;
  std::function<void(const Forward&)> forward_;
  std::function<void(const Backward&)> backward_;
};

}  // namespace

Var causal_product(const Var& a, const Var& b, const Var& v) {
  const kernels::LinearAttentionShape s = check_inputs("causal_product", "a", "b", a, b, v);
  return Function::apply<KernelFunction>(
      {a, b, v}, "causal_product", KernelFunction::Layout{},
      [s](const KernelFunction::Forward& f) { kernels::causal_product_forward(f.a, f.b, f.v, f.y, s); },
      [s](const KernelFunction::Backward& g) {
        kernels::causal_product_backward(g.a, g.b, g.v, g.dy, g.da, g.db, g.dv, s);
      })[0];
}

Var linear_attention(const Var& a, const Var& b, const Var& v, bool causal, Scalar eps) {
  const kernels::LinearAttentionShape s = check_inputs("linear_attention", "a", "b", a, b, v);
  TAPEFORMER_CHECK(std::isfinite(eps) && eps > 0, "linear_attention: eps must be finite and > 0, got ", eps);
  return Function::apply<KernelFunction>(
      {a, b, v}, "linear_attention", KernelFunction::Layout{/*rows=*/true},  // rows: the denominators
      [s, causal, eps](const KernelFunction::Forward& f) {
        kernels::linear_attention_forward(f.a, f.b, f.v, f.y, f.rows, causal, eps, s);
      },
      [s, causal](const KernelFunction::Backward& g) {
        kernels::linear_attention_backward(g.a, g.b, g.v, g.y, g.rows, g.dy, g.da, g.db, g.dv, causal, s);
      })[0];
}

Var efficient_attention(const Var& q, const Var& k, const Var& v, bool causal) {
  const kernels::LinearAttentionShape s = check_inputs("efficient_attention", "q", "k", q, k, v);
  TAPEFORMER_CHECK(s.C > 0, "efficient_attention: q and k need at least one feature, got ", q.shape());
  if (causal) {
    return Function::apply<KernelFunction>(  // a, b are q, k
        {q, k, v}, "efficient_attention", KernelFunction::Layout{},
        [s](const KernelFunction::Forward& f) { kernels::efficient_attention_causal_forward(f.a, f.b, f.v, f.y, s); },
        [s](const KernelFunction::Backward& g) {
          kernels::efficient_attention_causal_backward(g.a, g.b, g.v, g.dy, g.da, g.db, g.dv, s);
        })[0];
  }
  // softmax over features of q (B, H, T, C) times the context (B, H, C, M):
  // every feature d's softmax over positions of k, applied to v.
  const Var context = matmul(softmax(transpose(k, 2, 3)), v);  // (B, H, C, M)
  return matmul(softmax(q), context);                          // (B, H, T, M)
}

Var favor_attention(const Var& a, const Var& b, const Var& v) {
  const kernels::LinearAttentionShape c = check_inputs("favor_attention", "a", "b", a, b, v);
  const kernels::FavorShape s{c.BH, c.T, c.C, c.M};
  return Function::apply<KernelFunction>(
      {a, b, v}, "favor_attention", KernelFunction::Layout{/*rows=*/true, /*skips_unneeded=*/true},  // rows: L
      [s](const KernelFunction::Forward& f) { kernels::favor_forward(f.a, f.b, f.v, f.y, f.rows, s); },
      [s](const KernelFunction::Backward& g) {
        kernels::favor_backward(g.a, g.b, g.v, g.y, g.rows, g.dy, g.da, g.db, g.dv, s);
      })[0];
}

}  // namespace tapeformer
