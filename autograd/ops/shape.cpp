// Shape ops: views and copies that move elements without arithmetic.
#include "tapeformer/autograd/function.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/eigen.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"

namespace tapeformer {

Var reshape(const Var& x, const Shape& shape) {
  TAPEFORMER_CHECK(x.defined(), "reshape: undefined input");
  Var out = make_result(x.value().reshape(shape), {&x});
  record_backward(out, [x](const Tensor& g) { accumulate_grad(x, g.reshape(x.shape()), "reshape"); });
  return out;
}

Var transpose(const Var& x, int a, int b) {
  TAPEFORMER_CHECK(x.defined(), "transpose: undefined input");
  Var out = make_result(x.value().transpose(a, b), {&x});
  record_backward(out, [x, a, b](const Tensor& g) {
    accumulate_grad(x, g.transpose(a, b), "transpose");
  });
  return out;
}

Var permute(const Var& x, const std::vector<int>& order) {
  TAPEFORMER_CHECK(x.defined(), "permute: undefined input");
  Var out = make_result(x.value().permute(order), {&x});
  record_backward(out, [x, order](const Tensor& g) {
    std::vector<int> inverse(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      const int a = order[i] < 0 ? order[i] + x.rank() : order[i];
      inverse[a] = static_cast<int>(i);
    }
    accumulate_grad(x, g.permute(inverse), "permute");
  });
  return out;
}

Var slice(const Var& x, int axis, int64_t start, int64_t end) {
  TAPEFORMER_CHECK(x.defined(), "slice: undefined input");
  Var out = make_result(x.value().slice(axis, start, end), {&x});
  record_backward(out, [x, axis, start, end](const Tensor& g) {
    Tensor dx = Tensor::zeros(x.shape());
    dx.slice(axis, start, end).copy_from(g);
    accumulate_grad(x, dx, "slice");
  });
  return out;
}

Var concat(const std::vector<Var>& xs, int axis_in) {
  TAPEFORMER_CHECK(!xs.empty(), "concat: no inputs");
  for (const Var& x : xs) TAPEFORMER_CHECK(x.defined(), "concat: undefined input");
  const Shape first = xs[0].shape();
  const int axis = normalize_axis(axis_in, first, "concat");
  Shape out_shape = first;
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Shape& s = xs[i].shape();
    bool ok = s.rank() == first.rank();
    for (int d = 0; ok && d < s.rank(); ++d) ok = d == axis || s[d] == first[d];
    TAPEFORMER_CHECK(ok, "concat: input ", i, " has shape ", s, " but input 0 has ", first,
                     " (only axis ", axis, " may differ)");
    total += s[axis];
  }
  out_shape[axis] = total;
  Tensor y = Tensor::empty(out_shape);
  int64_t at = 0;
  for (const Var& x : xs) {
    y.slice(axis, at, at + x.dim(axis)).copy_from(x.value());
    at += x.dim(axis);
  }
  bool requires = false;
  if (grad_enabled())
    for (const Var& x : xs) requires = requires || x.requires_grad();
  Var out(std::move(y), requires);
  record_backward(out, [xs, axis](const Tensor& g) {
    int64_t at = 0;
    for (const Var& x : xs) {
      accumulate_grad(x, g.slice(axis, at, at + x.dim(axis)), "concat");
      at += x.dim(axis);
    }
  });
  return out;
}

std::vector<Var> split(const Var& x, const std::vector<int64_t>& sizes, int axis_in) {
  TAPEFORMER_CHECK(x.defined(), "split: undefined input");
  const int axis = normalize_axis(axis_in, x.shape(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    TAPEFORMER_CHECK(s >= 0, "split: negative size ", s);
    total += s;
  }
  TAPEFORMER_CHECK(total == x.dim(axis), "split: sizes sum to ", total, " but axis ", axis, " of ",
                   x.shape(), " has ", x.dim(axis));
  std::vector<Var> parts;
  int64_t at = 0;
  for (int64_t s : sizes) {
    parts.push_back(slice(x, axis, at, at + s));
    at += s;
  }
  return parts;
}

namespace {

// qkv (B, T, 3C) seen as (3, B, H, T, D): q, k, v are its three slices.
Tensor heads_view(const Tensor& qkv, int64_t H) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / (3 * H);
  return qkv.reshape({B, T, 3, H, D}).permute({2, 0, 3, 1, 4});
}
Tensor head_part(const Tensor& heads, int64_t i) {
  return heads.slice(0, i, i + 1).reshape({heads.dim(1), heads.dim(2), heads.dim(3), heads.dim(4)});
}

// One op with three outputs, so that the backward writes the three head
// gradients into one (B, T, 3C) buffer in one pass; through slice / permute /
// reshape it would pad and add three full-size buffers.
class SplitHeads : public Function {
 public:
  explicit SplitHeads(int64_t n_head) : n_head_(n_head) {}
  const char* name() const override { return "split_heads"; }
  std::vector<Tensor> forward(FunctionContext&, const std::vector<Tensor>& in) override {
    const Tensor& qkv = in[0];
    TAPEFORMER_CHECK(qkv.rank() == 3 && n_head_ > 0 && qkv.dim(2) % (3 * n_head_) == 0, "split_heads: qkv ",
                     qkv.shape(), " must be (B, T, 3C) with C divisible by n_head ", n_head_);
    shape_ = qkv.shape();
    const Tensor heads = heads_view(qkv, n_head_);  // (3, B, H, T, D)
    return {head_part(heads, 0), head_part(heads, 1), head_part(heads, 2)};
  }
  std::vector<Tensor> backward(FunctionContext&, const std::vector<Tensor>& grads) override {
    Tensor dqkv = Tensor::empty(shape_);  // (B, T, 3C), every element written below
    const Tensor heads = heads_view(dqkv, n_head_);
    for (int64_t i = 0; i < 3; ++i) head_part(heads, i).copy_from(grads[static_cast<size_t>(i)]);
    return {dqkv};
  }

 private:
  int64_t n_head_;
  Shape shape_;
};

}  // namespace

std::vector<Var> split_heads(const Var& qkv, int64_t n_head) {
  TAPEFORMER_CHECK(qkv.defined(), "split_heads: undefined input");
  return Function::apply<SplitHeads>({qkv}, n_head);
}

Var contiguous(const Var& x) {
  TAPEFORMER_CHECK(x.defined(), "contiguous: undefined input");
  if (x.value().is_contiguous()) return x;
  Var out = make_result(x.value().contiguous(), {&x});
  record_backward(out, [x](const Tensor& g) { accumulate_grad(x, g, "contiguous"); });
  return out;
}

Var detach(const Var& x) {
  TAPEFORMER_CHECK(x.defined(), "detach: undefined input");
  return Var(x.value(), false);
}

Var gather_rows(const Var& x, const IndexTensor& index) {
  TAPEFORMER_CHECK(x.defined() && x.rank() >= 2, "gather_rows: x must be (..., T, D), got ",
                   x.defined() ? x.shape() : Shape{});
  const int64_t T = x.dim(-2), D = x.dim(-1), rows = x.numel() / (T * D);  // rows: the leading dims' product
  const int64_t n = index.shape.empty() ? 0 : index.shape[-1];
  const bool shared = index.shape.rank() == 1;
  bool fits = shared || index.shape.rank() == x.rank() - 1;
  for (int d = 0; fits && !shared && d < x.rank() - 2; ++d) fits = index.shape[d] == x.dim(d);
  TAPEFORMER_CHECK(fits && n > 0, "gather_rows: index ", index.shape, " must be (Tout) or x's leading dims and Tout, x ",
                   x.shape());
  for (int64_t e = 0; e < index.numel(); ++e)
    TAPEFORMER_CHECK(index.data[e] >= 0 && index.data[e] < T, "gather_rows: index ", index.data[e], " at ", e,
                     " is outside the ", T, " rows of x ", x.shape());
  Shape out_shape = x.shape();
  out_shape[x.rank() - 2] = n;
  const Tensor xc = x.value().contiguous();
  Tensor y = Tensor::empty(out_shape);  // (..., Tout, D)
  const auto row_index = [&index, shared, n](int64_t r) { return index.data.data() + (shared ? 0 : r * n); };
  parallel::parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t* idx = row_index(r);
      for (int64_t t = 0; t < n; ++t)
        std::copy_n(xc.data() + (r * T + idx[t]) * D, D, y.data() + (r * n + t) * D);
    }
  });
  Var out = make_result(y, {&x});
  record_backward(out, [x, index, rows, T, D, n, shared](const Tensor& g_in) {
    const Tensor g = g_in.contiguous();
    Tensor dx = Tensor::zeros(x.shape());
    // Scatter-add, each leading row by one task in index order: repeated indices accumulate deterministically.
    parallel::parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int32_t* idx = index.data.data() + (shared ? 0 : r * n);
        for (int64_t t = 0; t < n; ++t)
          eigen::array(dx.data() + (r * T + idx[t]) * D, D) += eigen::array(g.data() + (r * n + t) * D, D);
      }
    });
    accumulate_grad(x, dx, "gather_rows");
  });
  return out;
}

}  // namespace tapeformer
