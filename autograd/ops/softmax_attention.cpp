// Memory-lean softmax attention, written with the public Function API: the
// tape keeps q, k, v, y and the row log-sum-exp, never the T x T probabilities.
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
  explicit SoftmaxAttention(AttentionSpec spec, bool with_lse) : spec_(std::move(spec)), with_lse_(with_lse) {
    for (const auto& t : spec_.terms) mods_.terms.push_back(t.mod.get());
    for (const auto& m : spec_.maps) mods_.maps.push_back(m.mod.get());
    for (const auto& m : spec_.masks) mods_.masks.push_back(m.get());
  }
  const char* name() const override { return "softmax_attention"; }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    TAPEFORMER_CHECK(in[0].rank() == 4 && in[1].rank() == 4 && in[2].rank() == 4,
                     "softmax_attention: q, k, v must be rank 4 (B, H, T, D), got q ", in[0].shape(), ", k ",
                     in[1].shape(), ", v ", in[2].shape());
    const Tensor q = last_dim_contiguous(in[0]);  // (B, H, Tq, D)
    const Tensor k = last_dim_contiguous(in[1]);  // (B, H, Tk, D)
    const Tensor v = last_dim_contiguous(in[2]);  // (B, H, Tk, Dv)
    const int64_t B = q.dim(0), H = q.dim(1), Tq = q.dim(2), D = q.dim(3), Tk = k.dim(2), Dv = v.dim(3);
    TAPEFORMER_CHECK(k.dim(0) == B && k.dim(1) == H && k.dim(3) == D,
                     "softmax_attention: k must be (B, H, Tk, D) with q's B, H and D: q ", q.shape(), ", k ",
                     k.shape());
    TAPEFORMER_CHECK(v.dim(0) == B && v.dim(1) == H && v.dim(2) == Tk,
                     "softmax_attention: v must be (B, H, Tk, Dv) with k's B, H and Tk: k ", k.shape(), ", v ",
                     v.shape());
    TAPEFORMER_CHECK(!spec_.causal || Tq <= Tk,
                     "softmax_attention: causal attention needs Tq <= Tk (queries are the last Tq positions), got q ",
                     q.shape(), ", k ", k.shape());
    const Scalar p = spec_.dropout_p;
    TAPEFORMER_CHECK(p >= 0 && p < 1, "softmax_attention: dropout ", p, " is not in [0, 1)");
    TAPEFORMER_CHECK(p == 0 || spec_.rng != nullptr, "softmax_attention: dropout ", p, " needs an Rng");
    const kernels::BlockMask* blocks = spec_.blocks.get();
    TAPEFORMER_CHECK(!blocks || (blocks->Tq == Tq && blocks->Tk == Tk), "softmax_attention: the block mask is for Tq ",
                     blocks ? blocks->Tq : 0, ", Tk ", blocks ? blocks->Tk : 0, " but q is ", q.shape(), " and k ",
                     k.shape());
    for (const auto& t : spec_.terms) t.mod->check(B, H, Tq, Tk);
    for (const auto& m : spec_.maps) m.mod->check(B, H, Tq, Tk);
    for (const auto& m : spec_.masks) m->check(B, H, Tq, Tk);
    const Shape scores{B, H, Tq, Tk};
    bias_.clear();
    bias_terms_.clear();
    for (size_t t = 0; t < spec_.bias.size(); ++t) {
      const Tensor& b = spec_.bias[t];
      TAPEFORMER_CHECK(b.defined(), "softmax_attention: bias term ", t, " is undefined");
      bool fits = b.rank() <= 4;
      for (int d = 1; fits && d <= b.rank(); ++d) fits = b.dim(-d) == 1 || b.dim(-d) == scores[4 - d];
      TAPEFORMER_CHECK(fits, "softmax_attention: bias term ", t, " of shape ", b.shape(),
                       " does not broadcast to the scores (B, H, Tq, Tk) = ", scores);
      const Tensor e = b.expand(scores);  // stride 0 on broadcast dims
      bias_.push_back(e);
      bias_terms_.push_back(std::make_shared<kernels::BiasTerm>(e.data(), e.strides()[0], e.strides()[1],
                                                                e.strides()[2], e.strides()[3]));
    }
    shape_ = {B, H, Tq, Tk, D, Dv};
    seed_ = p > 0 ? spec_.rng->next_u64() : 0;
    if (!spec_.groups.empty()) check_groups();
    TAPEFORMER_CHECK(!with_lse_ || spec_.groups.empty(),
                     "softmax_attention: the row log-sum-exp is an output of one call; it has head groups");
    Tensor ybuf = Tensor::empty({B, Tq, H, Dv});  // (B, Tq, H, Dv): heads merge for free
    Tensor y = ybuf.permute({0, 2, 1, 3});        // (B, H, Tq, Dv) view
    std::vector<Tensor> saved{q, k, v, y};
    for (const Part& part : parts()) {
      Tensor lse = Tensor::empty({B, part.heads, part.rows});  // (B, H', T') row log-sum-exp of the part
      kernels::flash_attention_forward(args(part, q, k, v), out(part, y), lse.data());
      saved.push_back(lse);
    }
    if (with_lse_) {
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
    // The learned modifiers' parameters, inputs 3.. in the order of their modifiers.
    std::vector<Tensor> dparams;
    std::vector<Scalar*> grads(bias_terms_.size(), nullptr);  // the constant terms learn nothing
    size_t input = 3;
    const auto learned = [&](const Var& parameter) {
      if (!parameter.defined()) {
        grads.push_back(nullptr);
        return;
      }
      Tensor d = ctx.needs_input_grad(input) ? Tensor::zeros(parameter.shape()) : Tensor();
      grads.push_back(d.defined() ? d.data() : nullptr);
      dparams.push_back(d);
      ++input;
    };
    for (const auto& t : spec_.terms) learned(t.parameter);
    for (const auto& m : spec_.maps) learned(m.parameter);
    const Tensor dlse = dout.size() > 1 && dout[1].defined() ? dout[1].contiguous() : Tensor();  // (B, H, Tq)
    const std::vector<Part> all = parts();
    for (size_t i = 0; i < all.size(); ++i) {
      const Part& part = all[i];
      kernels::FlashAttention a = args(part, q, k, v);
      a.mods.grads = grads;
      const auto maybe = [&](Tensor& t) { return t.defined() ? out(part, t) : kernels::HeadOut{nullptr, 0, 0, 0}; };
      kernels::flash_attention_backward(a, in(part, y), ctx.saved()[4 + i].data(), in(part, dy), maybe(dq), maybe(dk),
                                        maybe(dv), dlse.defined() ? dlse.data() : nullptr);
    }
    std::vector<Tensor> grads_out{dq, dk, dv};
    grads_out.insert(grads_out.end(), dparams.begin(), dparams.end());
    return grads_out;
  }

 private:
  // One kernel call: heads [h0, h0 + heads) over every row, with `tiles`; or,
  // with period > 0, the residue classes c0 .. c0 + heads - 1 of head h0 as
  // the call's heads, each a causal sequence of `rows` rows c, c + period, ...
  struct Part {
    int64_t h0, heads, c0, rows, period;
    const kernels::BlockMask* tiles;
    uint64_t seed;
  };

  std::vector<Part> parts() const {
    if (spec_.groups.empty()) return {{0, shape_.H, 0, shape_.Tq, 0, spec_.blocks.get(), seed_}};
    std::vector<Part> all;
    const auto seed = [&] {  // a dropout mask per part (the kernel's mask counters restart in each)
      uint64_t z = seed_ + (all.size() + 1) * 0x9e3779b97f4a7c15ULL;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      return z ^ (z >> 31);
    };
    for (const AttentionHeadGroup& g : spec_.groups) {
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
    TAPEFORMER_CHECK(spec_.blocks == nullptr, "softmax_attention: head groups carry their own block masks; the "
                                              "spec's block mask would be ignored");
    int64_t next = 0;
    for (const AttentionHeadGroup& g : spec_.groups) {
      TAPEFORMER_CHECK(g.h0 == next && g.h1 > g.h0 && g.h1 <= shape_.H,
                       "softmax_attention: head groups must cover heads [0, ", shape_.H,
                       ") in order, each non-empty; a group is [", g.h0, ", ", g.h1, ") after head ", next);
      TAPEFORMER_CHECK(g.period >= 0, "softmax_attention: the period of heads [", g.h0, ", ", g.h1, ") is ",
                       g.period, "; it must be > 0 (residue classes) or 0 (tiles)");
      TAPEFORMER_CHECK((g.period > 0) != (g.tiles != nullptr),
                       "softmax_attention: a head group has either tiles or a period > 0, not ",
                       g.tiles ? "both" : "neither");
      TAPEFORMER_CHECK(g.period == 0 || (shape_.Tq == shape_.Tk && spec_.causal),
                       "softmax_attention: residue classes (period ", g.period,
                       ") are for causal self-attention, Tq == Tk; got Tq ", shape_.Tq, ", Tk ", shape_.Tk);
      TAPEFORMER_CHECK(!g.tiles || (g.tiles->Tq == shape_.Tq && g.tiles->Tk == shape_.Tk),
                       "softmax_attention: the tiles of heads [", g.h0, ", ", g.h1, ") are for Tq ", g.tiles->Tq,
                       ", Tk ", g.tiles->Tk, " but the scores are ", shape_.Tq, " x ", shape_.Tk);
      next = g.h1;
    }
    TAPEFORMER_CHECK(next == shape_.H, "softmax_attention: head groups cover heads [0, ", next, ") of ", shape_.H);
  }

  kernels::FlashAttention args(const Part& part, const Tensor& q, const Tensor& k, const Tensor& v) const {
    const int64_t Tq = part.period ? part.rows : shape_.Tq, Tk = part.period ? part.rows : shape_.Tk;
    kernels::FlashAttention a;
    a.s = {shape_.B, part.heads, Tq, Tk, shape_.D, shape_.Dv};
    a.q = in(part, q), a.k = in(part, k), a.v = in(part, v);
    a.causal = spec_.causal;
    a.dropout_p = spec_.dropout_p;
    a.seed = part.seed;
    a.blocks = part.tiles;
    a.mods = mods_;
    std::vector<const kernels::ScoreTerm*> terms;  // the constant bias terms first, then the spec's
    for (const auto& t : bias_terms_) terms.push_back(t.get());
    terms.insert(terms.end(), mods_.terms.begin(), mods_.terms.end());
    a.mods.terms = std::move(terms);
    a.place = {part.h0, part.c0, part.period, shape_.Tq, shape_.Tk};
    return a;
  }

  AttentionSpec spec_;
  bool with_lse_;
  kernels::ScoreMods mods_;  // the spec's modifiers (the constant bias terms are put first per call)
  std::vector<Tensor> bias_;  // the spec's bias, expanded to (B, H, Tq, Tk) in the forward; no gradient
  std::vector<std::shared_ptr<const kernels::BiasTerm>> bias_terms_;  // reading bias_
  kernels::FlashAttentionShape shape_{};
  uint64_t seed_ = 0;  // of the dropout mask, regenerated by the backward
};

}  // namespace

Var softmax_attention(const Var& q, const Var& k, const Var& v, const AttentionSpec& spec, Var* lse) {
  TAPEFORMER_CHECK(q.defined() && k.defined() && v.defined(), "softmax_attention: undefined input");
  std::vector<Var> inputs{q, k, v};
  for (const auto& t : spec.terms) {
    TAPEFORMER_CHECK(t.mod != nullptr, "softmax_attention: a score term is null");
    if (t.parameter.defined()) inputs.push_back(t.parameter);
  }
  for (const auto& m : spec.maps) {
    TAPEFORMER_CHECK(m.mod != nullptr, "softmax_attention: a score map is null");
    if (m.parameter.defined()) inputs.push_back(m.parameter);
  }
  for (const auto& m : spec.masks) TAPEFORMER_CHECK(m != nullptr, "softmax_attention: a score mask is null");
  std::vector<Var> out = Function::apply<SoftmaxAttention>(inputs, spec, lse != nullptr);
  if (lse) *lse = out[1];
  return out[0];
}

}  // namespace tapeformer
