#include "tapeformer/layers/block/reversible.h"

#include <algorithm>
#include <string>

#include "tapeformer/autograd/function.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"

namespace tapeformer {
namespace {

// [start, end) of slice c of n near-equal slices of T positions.
std::pair<int64_t, int64_t> chunk(int64_t T, int64_t n, int64_t c) { return {T * c / n, T * (c + 1) / n}; }

Tensor zeros_if_undefined(const Var& v) { return v.has_grad() ? v.grad() : Tensor::zeros(v.shape()); }

// The stack as one op: the forward keeps (Y1, Y2) of the last layer and each
// branch's Rng; the backward rebuilds every layer's inputs and backpropagates
// through its branches on a nested tape (docs/math.md#reversible-backward). The parameters'
// gradients accumulate on that tape, straight into the parameters.
class ReversibleFunction : public Function {
 public:
  ReversibleFunction(const ReversibleStack& stack, Rng& rng) : stack_(stack), rng_(rng) {}
  const char* name() const override { return "reversible stack"; }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    Var x1(in[0]), x2(in[0]);  // (B, T, C) each
    for (const auto& block : stack_.blocks) {
      f_rng_.push_back(rng_);
      const Var y1 = add(x1, block->attention_branch(x2, rng_));
      g_rng_.push_back(rng_);
      x2 = stack_.ff_coupling(*block, x2, y1, rng_);
      x1 = y1;
    }
    ctx.save_for_backward({x1.value(), x2.value()});
    return {mul_scalar(add(x1, x2), 0.5f).value()};  // (B, T, C)
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    Tensor y1 = ctx.saved()[0], y2 = ctx.saved()[1];  // (B, T, C)
    Tensor dy1 = mul_scalar(Var(dout[0]), 0.5f).value(), dy2 = dy1;
    const int64_t T = y1.dim(1), n = std::min(stack_.ff_chunks, T);
    for (size_t l = stack_.blocks.size(); l-- > 0;) {
      const TransformerBlock& block = *stack_.blocks[l];
      // G, slice by slice: X2 = Y2 - G(Y1), and G's share of dL/dY1.
      std::vector<Var> x2_parts, gy_parts;
      Rng g_rng = g_rng_[l];
      for (int64_t c = 0; c < n; ++c) {
        const auto [t0, t1] = chunk(T, n, c);
        TapeScope scope;
        Var y1c(n == 1 ? y1 : y1.slice(1, t0, t1).contiguous(), /*requires_grad=*/true);
        const Var g = block.ff_branch(y1c, g_rng);
        tapeformer::backward(g, n == 1 ? dy2 : dy2.slice(1, t0, t1).contiguous());
        x2_parts.push_back(sub(Var(n == 1 ? y2 : y2.slice(1, t0, t1)), Var(g.value())));
        gy_parts.push_back(Var(zeros_if_undefined(y1c)));
      }
      const Tensor x2 = n == 1 ? x2_parts[0].value() : concat(x2_parts, 1).value();
      const Tensor dx1 = add(Var(dy1), n == 1 ? gy_parts[0] : concat(gy_parts, 1)).value();  // dL/dY1 = dL/dX1
      // F: X1 = Y1 - F(X2), and F's share of dL/dX2.
      Tensor x1, fx;
      {
        TapeScope scope;
        Rng f_rng = f_rng_[l];
        Var x2v(x2, /*requires_grad=*/true);
        const Var f = block.attention_branch(x2v, f_rng);
        tapeformer::backward(f, dx1);
        x1 = sub(Var(y1), Var(f.value())).value();
        fx = zeros_if_undefined(x2v);
      }
      if (stack_.on_rebuilt) stack_.on_rebuilt(l, x1, x2);
      dy2 = add(Var(dy2), Var(fx)).value();
      dy1 = dx1;
      y1 = x1;
      y2 = x2;
    }
    return {add(Var(dy1), Var(dy2)).value()};  // X1 = X2 = x
  }

 private:
  const ReversibleStack& stack_;
  Rng& rng_;
  std::vector<Rng> f_rng_, g_rng_;  // each branch's Rng as it was before the branch ran, by layer
};

}  // namespace

ReversibleStack::ReversibleStack(const ModelConfig& cfg, const Positional& positional, Rng& rng)
    : ff_chunks(cfg.option_int("ff_chunks")) {
  for (int64_t i = 0; i < cfg.n_layer; ++i)
    blocks.push_back(register_module(std::to_string(i), std::make_shared<TransformerBlock>(cfg, positional, rng)));
}

Var ReversibleStack::ff_coupling(const TransformerBlock& block, const Var& x2, const Var& y1, Rng& rng) const {
  const int64_t T = y1.dim(1), n = std::min(ff_chunks, T);
  if (n == 1) return add(x2, block.ff_branch(y1, rng));
  std::vector<Var> parts;
  for (int64_t c = 0; c < n; ++c) {
    const auto [t0, t1] = chunk(T, n, c);
    parts.push_back(add(slice(x2, 1, t0, t1), block.ff_branch(slice(y1, 1, t0, t1), rng)));
  }
  return concat(parts, 1);  // (B, T, C)
}

Var ReversibleStack::forward(const Var& x, Rng& rng) const {
  TAPEFORMER_CHECK(x.rank() == 3, "ReversibleStack: input must be (B, T, C), got ", x.shape());
  return Function::apply<ReversibleFunction>({x}, *this, rng)[0];  // (B, T, C)
}

std::unique_ptr<InferenceState> ReversibleStack::make_state(int64_t batch, int64_t window) const {
  return LayerStates::of(blocks, batch, window);
}

Var ReversibleStack::forward(const Var& x, InferenceState& state) const {
  LayerStates& s = LayerStates::of_stack(state, blocks.size());
  Rng unused(0);  // eval mode: no dropout draws
  Var x1 = x, x2 = x;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Var y1 = add(x1, blocks[i]->attention_branch(x2, *s.layers[i]));
    x2 = ff_coupling(*blocks[i], x2, y1, unused);
    x1 = y1;
  }
  s.advance(x.dim(1));
  return mul_scalar(add(x1, x2), 0.5f);  // (B, T, C)
}

BlockKind reversible_block_kind() {
  BlockKind kind;
  kind.name = "reversible";
  kind.summary = "RevNet couplings Y1 = X1 + attn(ln_1(X2)), Y2 = X2 + mlp(ln_2(Y1)) (Gomez et al. 2017; Kitaev et al. "
                 "2020): each layer's inputs are rebuilt in the backward (dropout replayed) instead of kept; the "
                 "parameters and checkpoint keys of standard";
  kind.options = {{"ff_chunks", int64_t{1},
                   "reversible blocks: the feed-forward runs over this many slices of the sequence "
                   "(Kitaev et al. 2020 §3)"}};
  kind.make = [](const ModelConfig& cfg, const Positional& positional, Rng& rng) {
    return std::make_shared<ReversibleStack>(cfg, positional, rng);
  };
  kind.parameters = transformer_stack_parameters;
  kind.check = [](const ModelConfig& cfg) {
    const int64_t n = cfg.option_int("ff_chunks");
    TAPEFORMER_CHECK(n >= 1, "model.ff_chunks must be >= 1, got ", n);
  };
  return kind;
}

}  // namespace tapeformer
