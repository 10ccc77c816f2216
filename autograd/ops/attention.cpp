// Fused causal self-attention, written with the public Function API.
#include "tapeformer/autograd/function.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/attention.h"

namespace tapeformer {
namespace {

class CausalAttention : public Function {
 public:
  CausalAttention(int64_t n_head, Scalar dropout_p, Rng* rng) : n_head_(n_head), p_(dropout_p), rng_(rng) {}
  const char* name() const override { return "causal_attention"; }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    const Tensor qkv = in[0].contiguous();  // (B, T, 3C)
    TAPEFORMER_CHECK(qkv.rank() == 3 && qkv.dim(2) % 3 == 0, "causal_attention: qkv must be (B, T, 3C), got ",
                     qkv.shape());
    const int64_t C = qkv.dim(2) / 3;
    TAPEFORMER_CHECK(n_head_ > 0 && C % n_head_ == 0, "causal_attention: width ", C,
                     " is not divisible by n_head ", n_head_, " (qkv ", qkv.shape(), ")");
    TAPEFORMER_CHECK(p_ >= 0 && p_ < 1, "causal_attention: dropout ", p_, " is not in [0, 1)");
    TAPEFORMER_CHECK(p_ == 0 || rng_ != nullptr, "causal_attention: dropout needs an Rng");
    shape_ = {qkv.dim(0), qkv.dim(1), n_head_, C / n_head_};
    Tensor probs = Tensor::empty({shape_.B, shape_.H, shape_.T, shape_.T});  // (B, H, T, T)
    Tensor keep;
    if (p_ > 0) {
      keep = Tensor::empty(probs.shape());  // 0 or 1 / (1 - p)
      rng_->fill_dropout_mask(keep, p_);
    }
    Tensor y = Tensor::empty({shape_.B, shape_.T, C});  // (B, T, C)
    kernels::causal_attention_forward(qkv.data(), y.data(), probs.data(), keep.defined() ? keep.data() : nullptr,
                                      shape_);
    ctx.save_for_backward({qkv, probs, keep});
    return {y};
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const Tensor& qkv = ctx.saved()[0];
    const Tensor& probs = ctx.saved()[1];
    const Tensor& keep = ctx.saved()[2];
    const Tensor dy = dout[0].contiguous();
    Tensor dqkv = Tensor::empty(qkv.shape());  // every element is written
    kernels::causal_attention_backward(qkv.data(), probs.data(), keep.defined() ? keep.data() : nullptr, dy.data(),
                                       dqkv.data(), shape_);
    return {dqkv};
  }

 private:
  int64_t n_head_;
  Scalar p_;
  Rng* rng_;
  kernels::AttentionShape shape_{};
};

}  // namespace

Var causal_attention(const Var& qkv, int64_t n_head, Scalar dropout_p, Rng* rng) {
  TAPEFORMER_CHECK(qkv.defined(), "causal_attention: undefined input");
  return Function::apply<CausalAttention>({qkv}, n_head, dropout_p, rng)[0];
}

}  // namespace tapeformer
