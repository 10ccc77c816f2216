// GTrXL's GRU-type gate (Parisotto et al. 2020 §3.2) as one op with the
// hand-derived backward of docs/math.md#gru-gate-backward: one tape entry instead of the
// fifteen a composition records, and no intermediate kept but r, z and h.
#include "tapeformer/autograd/function.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"

namespace tapeformer {
namespace {

Var rows(const Tensor& t, int64_t C) { return reshape(Var(t.contiguous()), {t.numel() / C, C}); }  // (N, C)

class GruGate : public Function {
 public:
  const char* name() const override { return "gru_gate"; }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    const Tensor &x_in = in[0], &y_in = in[1], &w = in[2], &u = in[3], &ug = in[4], &bg = in[5];
    const int64_t C = x_in.dim(-1);
    TAPEFORMER_CHECK(x_in.shape() == y_in.shape() && x_in.rank() >= 1, "gru_gate: x ", x_in.shape(), " and y ",
                     y_in.shape(), " must have the same shape (..., C)");
    const bool fits = w.shape() == Shape({C, 3 * C}) && u.shape() == Shape({C, 2 * C}) &&
                      ug.shape() == Shape({C, C}) && bg.shape() == Shape({C});
    TAPEFORMER_CHECK(fits,
                     "gru_gate: for C = ", C, " the weights must be w (C, 3C), u (C, 2C), ug (C, C) and bg (C), got ",
                     w.shape(), ", ", u.shape(), ", ", ug.shape(), ", ", bg.shape());
    const Var x = rows(x_in, C), y = rows(y_in, C);
    const Var ay = matmul(y, Var(w)), ax = matmul(x, Var(u));  // (N, 3C), (N, 2C)
    const Var r = sigmoid(add(slice(ay, 1, 0, C), slice(ax, 1, 0, C)));
    const Var z = sigmoid(sub(add(slice(ay, 1, C, 2 * C), slice(ax, 1, C, 2 * C)), Var(bg)));
    const Var h = tanh(add(slice(ay, 1, 2 * C, 3 * C), matmul(mul(r, x), Var(ug))));
    const Var g = add(x, mul(z, sub(h, x)));  // (1 - z) x + z h
    ctx.save_for_backward({x.value(), y.value(), w, u, ug, r.value(), z.value(), h.value()});
    return {reshape(g, x_in.shape()).value()};
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const std::vector<Tensor>& s = ctx.saved();
    const Var x(s[0]), y(s[1]), w(s[2]), u(s[3]), ug(s[4]), r(s[5]), z(s[6]), h(s[7]);
    const Shape& shape = dout[0].shape();
    const int64_t C = shape[-1];
    const Var dg = rows(dout[0], C);
    const Var one_minus_z = add_scalar(neg(z), 1.0f);
    const Var dz = mul(dg, sub(h, x));
    const Var dc = mul(mul(dg, z), add_scalar(neg(mul(h, h)), 1.0f));   // through tanh
    const Var e = matmul(dc, transpose(ug, 0, 1));                        // d(r x)
    const Var da = mul(mul(e, x), mul(r, add_scalar(neg(r), 1.0f)));     // r's pre-activation
    const Var db = mul(dz, mul(z, one_minus_z));                          // z's pre-activation
    const Var day = concat({da, db, dc}, 1), dax = concat({da, db}, 1);   // (N, 3C), (N, 2C)
    const Var dx = add(add(mul(dg, one_minus_z), mul(e, r)), matmul(dax, transpose(u, 0, 1)));
    const Var dy = matmul(day, transpose(w, 0, 1));
    std::vector<Tensor> grads(6);
    if (ctx.needs_input_grad(0)) grads[0] = reshape(dx, shape).value();
    if (ctx.needs_input_grad(1)) grads[1] = reshape(dy, shape).value();
    if (ctx.needs_input_grad(2)) grads[2] = matmul(transpose(y, 0, 1), day).value();
    if (ctx.needs_input_grad(3)) grads[3] = matmul(transpose(x, 0, 1), dax).value();
    if (ctx.needs_input_grad(4)) grads[4] = matmul(transpose(mul(r, x), 0, 1), dc).value();
    if (ctx.needs_input_grad(5)) grads[5] = neg(sum(db, {0})).value();  // z = sigmoid(... - bg)
    return grads;
  }
};

}  // namespace

Var gru_gate(const Var& x, const Var& y, const Var& w, const Var& u, const Var& ug, const Var& bg) {
  return Function::apply<GruGate>({x, y, w, u, ug, bg})[0];
}

}  // namespace tapeformer
