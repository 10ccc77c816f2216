// Linear-attention ops (docs/math.md#linear-attention): the causal product, kernelised linear
// attention, efficient attention, and FAVOR+'s causal linear attention on
// log-features (core/kernels/favor.h, whose tape keeps a, b, v, y and the row
// log-normalisers L). The causal forms are Functions with hand-written
// backward passes that save O(T (C + M)) per slice; non-causal efficient
// attention is composed of ops.
#include <cmath>

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

class CausalProduct : public Function {
 public:
  explicit CausalProduct(kernels::LinearAttentionShape s) : s_(s) {}
  const char* name() const override { return "causal_product"; }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    const Tensor a = in[0].contiguous(), b = in[1].contiguous(), v = in[2].contiguous();
    Tensor y = Tensor::empty(v.shape());  // (B, H, T, M)
    kernels::causal_product_forward(a.data(), b.data(), v.data(), y.data(), s_);
    ctx.save_for_backward({a, b, v});
    return {y};
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const Tensor &a = ctx.saved()[0], &b = ctx.saved()[1], &v = ctx.saved()[2];
    const Tensor dy = dout[0].contiguous();
    Tensor da = Tensor::empty(a.shape()), db = Tensor::empty(b.shape()), dv = Tensor::empty(v.shape());
    kernels::causal_product_backward(a.data(), b.data(), v.data(), dy.data(), da.data(), db.data(), dv.data(), s_);
    return {da, db, dv};
  }

 private:
  kernels::LinearAttentionShape s_;
};

class LinearAttention : public Function {
 public:
  LinearAttention(kernels::LinearAttentionShape s, bool causal, Scalar eps) : s_(s), causal_(causal), eps_(eps) {}
  const char* name() const override { return "linear_attention"; }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    const Tensor a = in[0].contiguous(), b = in[1].contiguous(), v = in[2].contiguous();
    Tensor y = Tensor::empty(v.shape());                                    // (B, H, T, M)
    Tensor den = Tensor::empty({a.dim(0), a.dim(1), a.dim(2)});            // (B, H, T)
    kernels::linear_attention_forward(a.data(), b.data(), v.data(), y.data(), den.data(), causal_, eps_, s_);
    ctx.save_for_backward({a, b, v, y, den});
    return {y};
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const std::vector<Tensor>& sv = ctx.saved();
    const Tensor &a = sv[0], &b = sv[1], &v = sv[2], &y = sv[3], &den = sv[4];
    const Tensor dy = dout[0].contiguous();
    Tensor da = Tensor::empty(a.shape()), db = Tensor::empty(b.shape()), dv = Tensor::empty(v.shape());
    kernels::linear_attention_backward(a.data(), b.data(), v.data(), y.data(), den.data(), dy.data(), da.data(),
                                       db.data(), dv.data(), causal_, s_);
    return {da, db, dv};
  }

 private:
  kernels::LinearAttentionShape s_;
  bool causal_;
  Scalar eps_;
};

class CausalEfficientAttention : public Function {
 public:
  explicit CausalEfficientAttention(kernels::LinearAttentionShape s) : s_(s) {}
  const char* name() const override { return "efficient_attention"; }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    const Tensor q = in[0].contiguous(), k = in[1].contiguous(), v = in[2].contiguous();
    Tensor y = Tensor::empty(v.shape());  // (B, H, T, M)
    kernels::efficient_attention_causal_forward(q.data(), k.data(), v.data(), y.data(), s_);
    ctx.save_for_backward({q, k, v});
    return {y};
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const Tensor &q = ctx.saved()[0], &k = ctx.saved()[1], &v = ctx.saved()[2];
    const Tensor dy = dout[0].contiguous();
    Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()), dv = Tensor::empty(v.shape());
    kernels::efficient_attention_causal_backward(q.data(), k.data(), v.data(), dy.data(), dq.data(), dk.data(),
                                                 dv.data(), s_);
    return {dq, dk, dv};
  }

 private:
  kernels::LinearAttentionShape s_;
};

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

Var causal_product(const Var& a, const Var& b, const Var& v) {
  const kernels::LinearAttentionShape s = check_inputs("causal_product", "a", "b", a, b, v);
  return Function::apply<CausalProduct>({a, b, v}, s)[0];
}

Var linear_attention(const Var& a, const Var& b, const Var& v, bool causal, Scalar eps) {
  const kernels::LinearAttentionShape s = check_inputs("linear_attention", "a", "b", a, b, v);
  TAPEFORMER_CHECK(std::isfinite(eps) && eps > 0, "linear_attention: eps must be finite and > 0, got ", eps);
  return Function::apply<LinearAttention>({a, b, v}, s, causal, eps)[0];
}

Var efficient_attention(const Var& q, const Var& k, const Var& v, bool causal) {
  const kernels::LinearAttentionShape s = check_inputs("efficient_attention", "q", "k", q, k, v);
  TAPEFORMER_CHECK(s.C > 0, "efficient_attention: q and k need at least one feature, got ", q.shape());
  if (causal) return Function::apply<CausalEfficientAttention>({q, k, v}, s)[0];
  // softmax over features of q (B, H, T, C) times the context (B, H, C, M):
  // every feature d's softmax over positions of k, applied to v.
  const Var context = matmul(softmax(transpose(k, 2, 3)), v);  // (B, H, C, M)
  return matmul(softmax(q), context);                          // (B, H, T, M)
}

Var favor_attention(const Var& a, const Var& b, const Var& v) {
  const kernels::LinearAttentionShape s = check_inputs("favor_attention", "a", "b", a, b, v);
  return Function::apply<FavorAttention>({a, b, v}, kernels::FavorShape{s.BH, s.T, s.C, s.M})[0];
}

}  // namespace tapeformer
