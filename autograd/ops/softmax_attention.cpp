// Memory-lean softmax attention, written with the public Function API: the
// tape keeps q, k, v, y and the row log-sum-exp, never the T x T probabilities.
#include <unordered_map>

#include "autograd/function.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/kernels/flash_attention.h"

namespace tapeformer {
namespace {

// The kernels read a (B, H, T, X) operand by pointer and strides with a
// contiguous last dim; anything else is copied once.
Tensor last_dim_contiguous(const Tensor& t) { return t.strides()[3] == 1 || t.dim(3) == 1 ? t : t.contiguous(); }

kernels::HeadView view_of(const Tensor& t) { return {t.data(), t.strides()[0], t.strides()[1], t.strides()[2]}; }
kernels::HeadOut out_of(Tensor& t) { return {t.data(), t.strides()[0], t.strides()[1], t.strides()[2]}; }

class SoftmaxAttention : public Function {
 public:
  SoftmaxAttention(std::vector<Tensor> bias, bool causal, Scalar dropout_p, Rng* rng,
                   std::shared_ptr<const kernels::BlockSparsity> pattern = nullptr)
      : bias_(std::move(bias)), causal_(causal), p_(dropout_p), rng_(rng), pattern_(std::move(pattern)) {}
  const char* name() const override {
    return positions_ ? "positioned_attention" : pattern_ ? "block_sparse_attention" : "softmax_attention";
  }
  // Rows carry positions (positioned_attention): the kernel masks by them, and lse is a second output.
  void set_positions(IndexTensor q_pos, IndexTensor k_pos, bool mask_self) {
    q_pos_ = std::move(q_pos);
    k_pos_ = std::move(k_pos);
    mask_self_ = mask_self;
    positions_ = true;
    if (!mask_self_ || q_pos_.shape.rank() != 3 || k_pos_.shape.rank() != 3) return;  // shapes are checked in forward
    const int64_t BH = q_pos_.shape[0] * q_pos_.shape[1], Tq = q_pos_.shape[2], Tk = k_pos_.shape[2];
    if (k_pos_.shape[0] * k_pos_.shape[1] != BH) return;
    self_row_.assign(static_cast<size_t>(BH * Tq), -1);  // each query's own key row, by position
    std::unordered_map<int32_t, int32_t> row_of_position;
    for (int64_t bh = 0; bh < BH; ++bh) {
      row_of_position.clear();
      for (int64_t j = 0; j < Tk; ++j) row_of_position[k_pos_.data[static_cast<size_t>(bh * Tk + j)]] = static_cast<int32_t>(j);
      for (int64_t i = 0; i < Tq; ++i) {
        const auto it = row_of_position.find(q_pos_.data[static_cast<size_t>(bh * Tq + i)]);
        if (it != row_of_position.end()) self_row_[static_cast<size_t>(bh * Tq + i)] = it->second;
      }
    }
  }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    TAPEFORMER_CHECK(in[0].rank() == 4 && in[1].rank() == 4 && in[2].rank() == 4,
                     "softmax_attention: q, k, v must be rank 4 (B, H, T, D), got q ", in[0].shape(), ", k ",
                     in[1].shape(), ", v ", in[2].shape());
    const Tensor q = last_dim_contiguous(in[0]);  // (B, H, Tq, D)
    const Tensor k = last_dim_contiguous(in[1]);  // (B, H, Tk, D)
    const Tensor v = last_dim_contiguous(in[2]);  // (B, H, Tk, Dv)
    if (in.size() > 3) {
      dist_ = in[3].contiguous();  // (H, n)
      TAPEFORMER_CHECK(dist_.rank() == 2 && dist_.dim(0) == q.dim(1), "block_sparse_attention: the distance bias ",
                       dist_.shape(), " must be (H, n) with q's H = ", q.dim(1));
    }
    const int64_t B = q.dim(0), H = q.dim(1), Tq = q.dim(2), D = q.dim(3), Tk = k.dim(2), Dv = v.dim(3);
    TAPEFORMER_CHECK(k.dim(0) == B && k.dim(1) == H && k.dim(3) == D,
                     "softmax_attention: k must be (B, H, Tk, D) with q's B, H and D: q ", q.shape(), ", k ",
                     k.shape());
    TAPEFORMER_CHECK(v.dim(0) == B && v.dim(1) == H && v.dim(2) == Tk,
                     "softmax_attention: v must be (B, H, Tk, Dv) with k's B, H and Tk: k ", k.shape(), ", v ",
                     v.shape());
    TAPEFORMER_CHECK(!causal_ || Tq <= Tk,
                     "softmax_attention: causal attention needs Tq <= Tk (queries are the last Tq positions), got q ",
                     q.shape(), ", k ", k.shape());
    TAPEFORMER_CHECK(p_ >= 0 && p_ < 1, "softmax_attention: dropout ", p_, " is not in [0, 1)");
    TAPEFORMER_CHECK(!pattern_ || (pattern_->Tq == Tq && pattern_->Tk == Tk), "block_sparse_attention: the pattern is for Tq ",
                     pattern_ ? pattern_->Tq : 0, ", Tk ", pattern_ ? pattern_->Tk : 0, " but q is ", q.shape(),
                     " and k ", k.shape());
    TAPEFORMER_CHECK(p_ == 0 || rng_ != nullptr, "softmax_attention: dropout ", p_, " needs an Rng");
    const Shape scores{B, H, Tq, Tk};
    for (size_t t = 0; t < bias_.size(); ++t) {
      const Tensor& b = bias_[t];
      TAPEFORMER_CHECK(b.defined(), "softmax_attention: bias term ", t, " is undefined");
      bool fits = b.rank() <= 4;
      for (int d = 1; fits && d <= b.rank(); ++d) fits = b.dim(-d) == 1 || b.dim(-d) == scores[4 - d];
      TAPEFORMER_CHECK(fits, "softmax_attention: bias term ", t, " of shape ", b.shape(),
                       " does not broadcast to the scores (B, H, Tq, Tk) = ", scores);
      bias_[t] = b.expand(scores);  // stride 0 on broadcast dims
    }
    shape_ = {B, H, Tq, Tk, D, Dv};
    seed_ = p_ > 0 ? rng_->next_u64() : 0;
    Tensor ybuf = Tensor::empty({B, Tq, H, Dv});  // (B, Tq, H, Dv): heads merge for free
    Tensor y = ybuf.permute({0, 2, 1, 3});        // (B, H, Tq, Dv) view
    Tensor lse = Tensor::empty({B, H, Tq});       // (B, H, Tq) row log-sum-exp
    kernels::DistanceBias db{dist_.defined() ? dist_.data() : nullptr, dist_.defined() ? dist_.dim(1) : 0, nullptr};
    kernels::FlashAttention a = args(q, k, v);
    if (dist_.defined()) a.distance_bias = &db;
    if (positions_) {
      TAPEFORMER_CHECK(q_pos_.shape == Shape({B, H, Tq}) && k_pos_.shape == Shape({B, H, Tk}),
                       "positioned_attention: q_pos ", q_pos_.shape, " and k_pos ", k_pos_.shape, " must be (B, H, Tq) = (",
                       B, ", ", H, ", ", Tq, ") and (B, H, Tk) = (", B, ", ", H, ", ", Tk, ")");
    }
    kernels::flash_attention_forward(a, out_of(y), lse.data());
    ctx.save_for_backward({q, k, v, y, lse});
    if (positions_) return {y, lse};
    return {y};
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const Tensor &q = ctx.saved()[0], &k = ctx.saved()[1], &v = ctx.saved()[2];
    const Tensor &y = ctx.saved()[3], &lse = ctx.saved()[4];
    const Tensor dy = last_dim_contiguous(dout[0]);  // (B, H, Tq, Dv)
    // Every element of a wanted gradient is written by the kernel.
    Tensor dq = ctx.needs_input_grad(0) ? Tensor::empty(q.shape()) : Tensor();  // (B, H, Tq, D)
    Tensor dk = ctx.needs_input_grad(1) ? Tensor::empty(k.shape()) : Tensor();  // (B, H, Tk, D)
    Tensor dv = ctx.needs_input_grad(2) ? Tensor::empty(v.shape()) : Tensor();  // (B, H, Tk, Dv)
    auto maybe = [](Tensor& t) { return t.defined() ? out_of(t) : kernels::HeadOut{nullptr, 0, 0, 0}; };
    kernels::FlashAttention a = args(q, k, v);
    Tensor ddist = dist_.defined() && ctx.needs_input_grad(3) ? Tensor::zeros(dist_.shape()) : Tensor();  // (H, n)
    kernels::DistanceBias db{dist_.defined() ? dist_.data() : nullptr, dist_.defined() ? dist_.dim(1) : 0,
                             ddist.defined() ? ddist.data() : nullptr};
    if (dist_.defined()) a.distance_bias = &db;
    const Tensor dlse = dout.size() > 1 && dout[1].defined() ? dout[1].contiguous() : Tensor();  // (B, H, Tq)
    kernels::flash_attention_backward(a, view_of(y), lse.data(), view_of(dy), maybe(dq), maybe(dk), maybe(dv),
                                      dlse.defined() ? dlse.data() : nullptr);
    if (dist_.defined()) return {dq, dk, dv, ddist};
    return {dq, dk, dv};
  }

 private:
  kernels::FlashAttention args(const Tensor& q, const Tensor& k, const Tensor& v) const {
    std::vector<kernels::ScoreBias> terms;
    for (const Tensor& b : bias_)
      terms.push_back({b.data(), b.strides()[0], b.strides()[1], b.strides()[2], b.strides()[3]});
    kernels::FlashAttention a{shape_, view_of(q), view_of(k), view_of(v), std::move(terms), causal_, p_, seed_,
                              pattern_.get()};
    if (positions_) {
      a.q_pos = q_pos_.data.data();
      a.k_pos = k_pos_.data.data();
      if (mask_self_ && !self_row_.empty()) a.self_row = self_row_.data();
    }
    return a;
  }

  std::vector<Tensor> bias_;  // expanded to (B, H, Tq, Tk) in the forward; no gradient
  bool causal_;
  Scalar p_;
  Rng* rng_;
  std::shared_ptr<const kernels::BlockSparsity> pattern_;  // null: dense
  Tensor dist_;  // the distance bias (H, n), when given as a fourth input
  bool positions_ = false, mask_self_ = false;
  IndexTensor q_pos_, k_pos_;    // (B, H, Tq), (B, H, Tk)
  std::vector<int32_t> self_row_;  // (B, H, Tq): the key row at the query's position, or -1
  kernels::FlashAttentionShape shape_{};
  uint64_t seed_ = 0;  // of the dropout mask, regenerated by the backward
};

}  // namespace

Var softmax_attention(const Var& q, const Var& k, const Var& v, const std::vector<Tensor>& bias, bool causal,
                      Scalar dropout_p, Rng* rng) {
  TAPEFORMER_CHECK(q.defined() && k.defined() && v.defined(), "softmax_attention: undefined input");
  return Function::apply<SoftmaxAttention>({q, k, v}, bias, causal, dropout_p, rng)[0];
}

Var block_sparse_attention(const Var& q, const Var& k, const Var& v,
                           std::shared_ptr<const kernels::BlockSparsity> pattern, const std::vector<Tensor>& bias,
                           bool causal, Scalar dropout_p, Rng* rng, const Var& distance_bias) {
  TAPEFORMER_CHECK(q.defined() && k.defined() && v.defined(), "block_sparse_attention: undefined input");
  TAPEFORMER_CHECK(pattern != nullptr, "block_sparse_attention: no pattern");
  if (distance_bias.defined())
    return Function::apply<SoftmaxAttention>({q, k, v, distance_bias}, bias, causal, dropout_p, rng,
                                             std::move(pattern))[0];
  return Function::apply<SoftmaxAttention>({q, k, v}, bias, causal, dropout_p, rng, std::move(pattern))[0];
}

std::vector<Var> positioned_attention(const Var& q, const Var& k, const Var& v,
                                      std::shared_ptr<const kernels::BlockSparsity> pattern, const IndexTensor& q_pos,
                                      const IndexTensor& k_pos, bool mask_self, Scalar dropout_p, Rng* rng) {
  TAPEFORMER_CHECK(q.defined() && k.defined() && v.defined(), "positioned_attention: undefined input");
  auto f = std::make_shared<SoftmaxAttention>(std::vector<Tensor>{}, /*causal=*/false, dropout_p, rng, std::move(pattern));
  f->set_positions(q_pos, k_pos, mask_self);
  return apply_function(f, {q, k, v});
}

}  // namespace tapeformer
