// Neural-network ops with fused kernels: softmax family, norms, cross-entropy, embedding.
#include <cstring>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/rebuild.h"
#include "tapeformer/core/eigen.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/norm.h"
#include "tapeformer/core/kernels/softmax.h"

namespace tapeformer {
namespace {

// [..., n] viewed as rows x n.
struct Rows {
  int64_t rows, n;
};
Rows rows_of(const Shape& s, const char* op) {
  TAPEFORMER_CHECK(s.rank() >= 1, op, ": input must have rank >= 1, got ", s);
  return {s.numel() / std::max<int64_t>(1, s[-1]), s[-1]};
}

// Optional affine parameter of shape [C].
const Scalar* param_or_null(const Var& p, int64_t C, const char* op, const char* what,
                            const Shape& input) {
  if (!p.defined()) return nullptr;
  TAPEFORMER_CHECK(p.rank() == 1 && p.dim(0) == C, op, ": ", what, " shape ", p.shape(),
                   " must be [", C, "] for input ", input);
  TAPEFORMER_CHECK(p.value().is_contiguous(), op, ": ", what, " must be contiguous");
  return p.value().data();
}

// A row-wise op over the last axis whose backward needs only its output y.
using RowForward = void (*)(const Scalar* x, Scalar* y, int64_t rows, int64_t n);
using RowBackward = void (*)(const Scalar* y, const Scalar* dy, Scalar* dx, int64_t rows, int64_t n);

Var row_op(const Var& x, RowForward forward, RowBackward backward, const char* op) {
  TAPEFORMER_CHECK(x.defined(), op, ": undefined input");
  const Rows r = rows_of(x.shape(), op);
  const Tensor xc = x.value().contiguous();
  Tensor y = Tensor::empty(x.shape());
  forward(xc.data(), y.data(), r.rows, r.n);
  Var out = make_result(y, {&x});
  record_backward(out, [x, y, r, backward, op](const Tensor& g_in) {
    const Tensor g = g_in.contiguous();
    Tensor dx = Tensor::empty(x.shape());
    backward(y.data(), g.data(), dx.data(), r.rows, r.n);
    accumulate_grad(x, dx, op);
  });
  return out;
}

}  // namespace

Var softmax(const Var& x) {
  return row_op(x, kernels::softmax_rows, kernels::softmax_backward_rows, "softmax");
}

Var log_softmax(const Var& x) {
  return row_op(x, kernels::log_softmax_rows, kernels::log_softmax_backward_rows, "log_softmax");
}

Var layer_norm(const Var& x, const Var& weight, const Var& bias, Scalar eps) {
  TAPEFORMER_CHECK(x.defined(), "layer_norm: undefined input");
  TAPEFORMER_CHECK(eps > 0, "layer_norm: eps must be > 0, got ", eps);
  const Rows r = rows_of(x.shape(), "layer_norm");
  const Scalar* w = param_or_null(weight, r.n, "layer_norm", "weight", x.shape());
  const Scalar* b = param_or_null(bias, r.n, "layer_norm", "bias", x.shape());
  const Tensor xc = x.value().contiguous();
  Tensor y = Tensor::empty(x.shape());
  Tensor mean = Tensor::empty({r.rows}), rstd = Tensor::empty({r.rows});  // (rows)
  kernels::layer_norm_rows(xc.data(), w, b, y.data(), mean.data(), rstd.data(), r.rows, r.n, eps);
  Var out = make_result(y, {&x, &weight, &bias});
  record_backward(out, [x, weight, bias, xc, mean, rstd, r](const Tensor& g_in) {
    const Tensor g = g_in.contiguous();
    Tensor dx = Tensor::empty(x.shape());
    Tensor dw = weight.requires_grad() ? Tensor::zeros({r.n}) : Tensor();
    Tensor db = bias.requires_grad() ? Tensor::zeros({r.n}) : Tensor();
    kernels::layer_norm_backward_rows(g.data(), xc.data(),
                                      weight.defined() ? weight.value().data() : nullptr,
                                      mean.data(), rstd.data(), dx.data(),
                                      dw.defined() ? dw.data() : nullptr,
                                      db.defined() ? db.data() : nullptr, r.rows, r.n);
    accumulate_grad(x, dx, "layer_norm");
    if (dw.defined()) accumulate_grad(weight, dw, "layer_norm");
    if (db.defined()) accumulate_grad(bias, db, "layer_norm");
  });
  // y comes back from x, mean and rstd (kept above) in one pass: its
  // consumers need not keep it (autograd/rebuild.h). gamma and beta are
  // copied, C floats each: the step changes the parameters in place.
  if (releasing() && out.requires_grad()) {
    const Tensor gamma = w ? Tensor::from({r.n}, std::vector<Scalar>(w, w + r.n)) : Tensor();
    const Tensor beta = b ? Tensor::from({r.n}, std::vector<Scalar>(b, b + r.n)) : Tensor();
    mark_rebuildable(out, [xc, gamma, beta, mean, rstd, r, shape = x.shape()] {
      Tensor again = Tensor::empty(shape);
      kernels::layer_norm_apply_rows(xc.data(), gamma.defined() ? gamma.data() : nullptr,
                                     beta.defined() ? beta.data() : nullptr, mean.data(), rstd.data(),
                                     again.data(), r.rows, r.n);
      return again;
    });
  }
  return out;
}

Var rms_norm(const Var& x, const Var& weight, Scalar eps) {
  TAPEFORMER_CHECK(x.defined(), "rms_norm: undefined input");
  TAPEFORMER_CHECK(eps > 0, "rms_norm: eps must be > 0, got ", eps);
  const Rows r = rows_of(x.shape(), "rms_norm");
  const Scalar* w = param_or_null(weight, r.n, "rms_norm", "weight", x.shape());
  const Tensor xc = x.value().contiguous();
  Tensor y = Tensor::empty(x.shape());
  Tensor rstd = Tensor::empty({r.rows});  // (rows)
  kernels::rms_norm_rows(xc.data(), w, y.data(), rstd.data(), r.rows, r.n, eps);
  Var out = make_result(y, {&x, &weight});
  record_backward(out, [x, weight, xc, rstd, r](const Tensor& g_in) {
    const Tensor g = g_in.contiguous();
    Tensor dx = Tensor::empty(x.shape());
    Tensor dw = weight.requires_grad() ? Tensor::zeros({r.n}) : Tensor();
    kernels::rms_norm_backward_rows(g.data(), xc.data(),
                                    weight.defined() ? weight.value().data() : nullptr, rstd.data(),
                                    dx.data(), dw.defined() ? dw.data() : nullptr, r.rows, r.n);
    accumulate_grad(x, dx, "rms_norm");
    if (dw.defined()) accumulate_grad(weight, dw, "rms_norm");
  });
  return out;
}

Var cross_entropy(const Var& logits, const IndexTensor& targets, int32_t ignore_index) {
  TAPEFORMER_CHECK(logits.defined(), "cross_entropy: undefined logits");
  const Rows r = rows_of(logits.shape(), "cross_entropy");
  Shape expected = logits.shape();
  expected.erase(-1);
  TAPEFORMER_CHECK(targets.shape == expected, "cross_entropy: targets shape ", targets.shape,
                   " must be logits shape ", logits.shape(), " without the last (vocab) dim, i.e. ",
                   expected);
  for (int64_t i = 0; i < targets.numel(); ++i) {
    const int32_t t = targets.data[i];
    TAPEFORMER_CHECK(t == ignore_index || (t >= 0 && t < r.n), "cross_entropy: target ", t,
                     " at position ", i, " is out of range for ", r.n, " classes (logits ",
                     logits.shape(), ")");
  }
  const Tensor z = logits.value().contiguous();
  Tensor lse = Tensor::empty({r.rows});  // (rows) logsumexp, saved for backward
  int64_t counted = 0;
  const double total = kernels::cross_entropy_rows(z.data(), targets.data.data(), lse.data(),
                                                   r.rows, r.n, ignore_index, &counted);
  const Scalar loss = counted ? static_cast<Scalar>(total / counted) : 0.0f;
  Var out = make_result(Tensor::scalar(loss), {&logits});
  record_backward(out, [logits, z, lse, targets, ignore_index, counted, r](const Tensor& g) {
    Tensor dz = Tensor::empty(logits.shape());
    const Scalar scale = counted ? g.item() / static_cast<Scalar>(counted) : 0.0f;
    kernels::cross_entropy_backward_rows(z.data(), targets.data.data(), lse.data(), scale,
                                         dz.data(), r.rows, r.n, ignore_index);
    accumulate_grad(logits, dz, "cross_entropy");
  });
  return out;
}

Var embedding(const Var& weight, const IndexTensor& ids) {
  TAPEFORMER_CHECK(weight.defined(), "embedding: undefined weight");
  TAPEFORMER_CHECK(weight.rank() == 2, "embedding: weight must be [V, C], got ", weight.shape());
  const int64_t V = weight.dim(0), C = weight.dim(1);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int32_t id = ids.data[i];
    TAPEFORMER_CHECK(id >= 0 && id < V, "embedding: index ", id, " at position ", i,
                     " is out of range for a vocabulary of ", V, " (weight ", weight.shape(), ")");
  }
  Shape out_shape = ids.shape;
  out_shape.push_back(C);
  const Tensor w = weight.value().contiguous();
  Tensor y = Tensor::empty(out_shape);  // (..., C)
  for (int64_t i = 0; i < ids.numel(); ++i)
    std::memcpy(y.data() + i * C, w.data() + ids.data[i] * C, sizeof(Scalar) * C);
  Var out = make_result(y, {&weight});
  record_backward(out, [weight, ids, V, C](const Tensor& g_in) {
    const Tensor g = g_in.contiguous();
    Tensor dw = Tensor::zeros({V, C});
    // Serial scatter-add: repeated ids accumulate in a fixed order.
    for (int64_t i = 0; i < ids.numel(); ++i)
      eigen::array(dw.data() + ids.data[i] * C, C) += eigen::array(g.data() + i * C, C);
    accumulate_grad(weight, dw, "embedding");
  });
  return out;
}

}  // namespace tapeformer
