// Memory-lean softmax attention, written with the public Function API: the
// tape keeps q, k, v, y and the row log-sum-exp, never the T x T probabilities.
#include <unordered_map>

#include "tapeformer/autograd/function.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/flash_attention.h"

namespace tapeformer {
namespace {

// The kernels read a (B, H, T, X) operand by pointer and strides with a
// contiguous last dim; anything else is copied once.
Tensor last_dim_contiguous(const Tensor& t) { return t.strides()[3] == 1 || t.dim(3) == 1 ? t : t.contiguous(); }

class SoftmaxAttention : public Function {
 public:
  SoftmaxAttention(std::vector<Tensor> bias, bool causal, Scalar dropout_p, Rng* rng,
                   std::shared_ptr<const kernels::BlockSparsity> pattern = nullptr,
                   std::vector<AttentionHeadGroup> groups = {})
      : bias_(std::move(bias)),
        causal_(causal),
        p_(dropout_p),
        rng_(rng),
        pattern_(std::move(pattern)),
        groups_(std::move(groups)) {}
  const char* name() const override {
    return positions_         ? "positioned_attention"
           : !groups_.empty() ? "grouped_sparse_attention"
           : pattern_         ? "block_sparse_attention"
                              : "softmax_attention";
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
    if (!groups_.empty()) check_groups();
    Tensor ybuf = Tensor::empty({B, Tq, H, Dv});  // (B, Tq, H, Dv): heads merge for free
    Tensor y = ybuf.permute({0, 2, 1, 3});        // (B, H, Tq, Dv) view
    if (positions_) {
      TAPEFORMER_CHECK(q_pos_.shape == Shape({B, H, Tq}) && k_pos_.shape == Shape({B, H, Tk}),
                       "positioned_attention: q_pos ", q_pos_.shape, " and k_pos ", k_pos_.shape, " must be (B, H, Tq) = (",
                       B, ", ", H, ", ", Tq, ") and (B, H, Tk) = (", B, ", ", H, ", ", Tk, ")");
    }
    std::vector<Tensor> saved{q, k, v, y};
    for (const Part& part : parts()) {
      Tensor lse = Tensor::empty({B, part.heads, part.rows});  // (B, H', T') row log-sum-exp of the part
      kernels::DistanceBias db{dist_.defined() ? dist_.data() : nullptr, dist_.defined() ? dist_.dim(1) : 0, nullptr};
      kernels::FlashAttention a = args(part, q, k, v);
      if (dist_.defined()) a.terms.distance = &db;
      kernels::flash_attention_forward(a, out(part, y), lse.data());
      saved.push_back(lse);
    }
    if (positions_) {
      ctx.save_for_backward(saved);
      return {y, saved[4]};
    }
    ctx.save_for_backward(std::move(saved));
    return {y};
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const Tensor &q = ctx.saved()[0], &k = ctx.saved()[1], &v = ctx.saved()[2], &y = ctx.saved()[3];
    const Tensor dy = last_dim_contiguous(dout[0]);  // (B, H, Tq, Dv)
    // Every element of a wanted gradient is written by exactly one part.
    Tensor dq = ctx.needs_input_grad(0) ? Tensor::empty(q.shape()) : Tensor();  // (B, H, Tq, D)
    Tensor dk = ctx.needs_input_grad(1) ? Tensor::empty(k.shape()) : Tensor();  // (B, H, Tk, D)
    Tensor dv = ctx.needs_input_grad(2) ? Tensor::empty(v.shape()) : Tensor();  // (B, H, Tk, Dv)
    Tensor ddist = dist_.defined() && ctx.needs_input_grad(3) ? Tensor::zeros(dist_.shape()) : Tensor();  // (H, n)
    kernels::DistanceBias db{dist_.defined() ? dist_.data() : nullptr, dist_.defined() ? dist_.dim(1) : 0,
                             ddist.defined() ? ddist.data() : nullptr};
    const Tensor dlse = dout.size() > 1 && dout[1].defined() ? dout[1].contiguous() : Tensor();  // (B, H, Tq)
    const std::vector<Part> all = parts();
    // A used lse is an output of positioned_attention only, which is one part.
    TAPEFORMER_CHECK(!dlse.defined() || all.size() == 1, "softmax_attention: an lse gradient for ", all.size(),
                     " parts");
    for (size_t i = 0; i < all.size(); ++i) {
      const Part& part = all[i];
      kernels::FlashAttention a = args(part, q, k, v);
      if (dist_.defined()) a.terms.distance = &db;
      const auto maybe = [&](Tensor& t) { return t.defined() ? out(part, t) : kernels::HeadOut{nullptr, 0, 0, 0}; };
      kernels::flash_attention_backward(a, in(part, y), ctx.saved()[4 + i].data(), in(part, dy), maybe(dq), maybe(dk),
                                        maybe(dv), dlse.defined() ? dlse.data() : nullptr);
    }
    if (dist_.defined()) return {dq, dk, dv, ddist};
    return {dq, dk, dv};
  }

 private:
  // One kernel call: heads [h0, h0 + heads) over every row, with `tiles`; or,
  // with period > 0, the residue classes c0 .. c0 + heads - 1 of head h0 as
  // the call's heads, each a causal sequence of `rows` rows c, c + period, ...
  struct Part {
    int64_t h0, heads, c0, rows, period;
    const kernels::BlockSparsity* tiles;
    uint64_t seed;
  };

  std::vector<Part> parts() const {
    if (groups_.empty()) return {{0, shape_.H, 0, shape_.Tq, 0, pattern_.get(), seed_}};
    std::vector<Part> all;
    const auto seed = [&] {  // a dropout mask per part (the kernel's mask counters restart in each)
      uint64_t z = seed_ + (all.size() + 1) * 0x9e3779b97f4a7c15ULL;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      return z ^ (z >> 31);
    };
    for (const AttentionHeadGroup& g : groups_) {
      if (g.period == 0) {
        all.push_back({g.h0, g.h1 - g.h0, 0, shape_.Tq, 0, g.tiles.get(), seed()});
        continue;
      }
      // T = M l + r: classes c < r have M + 1 rows, the others M.
      const int64_t T = shape_.Tq, l = g.period, M = T / l, r = T % l;
      for (int64_t h = g.h0; h < g.h1; ++h) {
        if (r > 0) all.push_back({h, r, 0, M + 1, l, nullptr, seed()});
        if (M > 0) all.push_back({h, l - r, r, M, l, nullptr, seed()});
      }
    }
    return all;
  }

  // A part's (B, H', T', X) view of a (B, H, T, X) operand.
  static kernels::HeadView in(const Part& p, const Tensor& t) {
    const int64_t sb = t.strides()[0], sh = t.strides()[1], st = t.strides()[2];
    if (p.period == 0) return {t.data() + p.h0 * sh, sb, sh, st};
    return {t.data() + p.h0 * sh + p.c0 * st, sb, st, p.period * st};
  }
  static kernels::HeadOut out(const Part& p, Tensor& t) {
    const kernels::HeadView v = in(p, t);
    return {const_cast<Scalar*>(v.data), v.sb, v.sh, v.st};
  }

  void check_groups() const {
    TAPEFORMER_CHECK(!positions_ && !dist_.defined(), "grouped_sparse_attention: takes no positions and no distance bias");
    int64_t next = 0;
    for (const AttentionHeadGroup& g : groups_) {
      TAPEFORMER_CHECK(g.h0 == next && g.h1 > g.h0 && g.h1 <= shape_.H,
                       "grouped_sparse_attention: head groups must cover heads [0, ", shape_.H,
                       ") in order, each non-empty; a group is [", g.h0, ", ", g.h1, ") after head ", next);
      TAPEFORMER_CHECK(g.period >= 0, "grouped_sparse_attention: the period of heads [", g.h0, ", ", g.h1,
                       ") is ", g.period, "; it must be > 0 (residue classes) or 0 (tiles)");
      TAPEFORMER_CHECK((g.period > 0) != (g.tiles != nullptr),
                       "grouped_sparse_attention: a head group has either tiles or a period > 0, not ",
                       g.tiles ? "both" : "neither");
      TAPEFORMER_CHECK(g.period == 0 || (shape_.Tq == shape_.Tk && causal_),
                       "grouped_sparse_attention: residue classes (period ", g.period,
                       ") are for causal self-attention, Tq == Tk; got Tq ", shape_.Tq, ", Tk ", shape_.Tk);
      TAPEFORMER_CHECK(!g.tiles || (g.tiles->Tq == shape_.Tq && g.tiles->Tk == shape_.Tk),
                       "grouped_sparse_attention: the tiles of heads [", g.h0, ", ", g.h1, ") are for Tq ", g.tiles->Tq,
                       ", Tk ", g.tiles->Tk, " but the scores are ", shape_.Tq, " x ", shape_.Tk);
      next = g.h1;
    }
    TAPEFORMER_CHECK(next == shape_.H, "grouped_sparse_attention: head groups cover heads [0, ", next, ") of ",
                     shape_.H);
  }

  kernels::FlashAttention args(const Part& part, const Tensor& q, const Tensor& k, const Tensor& v) const {
    std::vector<kernels::ScoreBias> terms;
    for (const Tensor& b : bias_) {
      const int64_t sb = b.strides()[0], sh = b.strides()[1], si = b.strides()[2], sj = b.strides()[3];
      if (part.period == 0) {
        terms.push_back({b.data() + part.h0 * sh, sb, sh, si, sj});
      } else {  // class c's pair (r, s) is the pair (c + period r, c + period s)
        terms.push_back({b.data() + part.h0 * sh + part.c0 * (si + sj), sb, si + sj, part.period * si, part.period * sj});
      }
    }
    const int64_t Tq = part.period ? part.rows : shape_.Tq, Tk = part.period ? part.rows : shape_.Tk;
    kernels::FlashAttention a{{shape_.B, part.heads, Tq, Tk, shape_.D, shape_.Dv},
                              in(part, q),
                              in(part, k),
                              in(part, v),
                              kernels::RowTerms{std::move(terms)},
                              causal_,
                              p_,
                              part.seed,
                              part.tiles};
    if (positions_) {
      a.terms.q_pos = q_pos_.data.data();
      a.terms.k_pos = k_pos_.data.data();
      if (mask_self_ && !self_row_.empty()) a.terms.self_row = self_row_.data();
    }
    return a;
  }

  std::vector<Tensor> bias_;  // expanded to (B, H, Tq, Tk) in the forward; no gradient
  bool causal_;
  Scalar p_;
  Rng* rng_;
  std::shared_ptr<const kernels::BlockSparsity> pattern_;  // null: dense
  std::vector<AttentionHeadGroup> groups_;                 // empty: one pattern (or none) for every head
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

Var grouped_sparse_attention(const Var& q, const Var& k, const Var& v, std::vector<AttentionHeadGroup> groups,
                             const std::vector<Tensor>& bias, Scalar dropout_p, Rng* rng) {
  TAPEFORMER_CHECK(q.defined() && k.defined() && v.defined(), "grouped_sparse_attention: undefined input");
  TAPEFORMER_CHECK(!groups.empty(), "grouped_sparse_attention: no head groups");
  return Function::apply<SoftmaxAttention>({q, k, v}, bias, /*causal=*/true, dropout_p, rng, nullptr,
                                           std::move(groups))[0];
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
