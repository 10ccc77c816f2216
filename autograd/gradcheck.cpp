#include "tapeformer/autograd/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/rng.h"

namespace tapeformer {
namespace {

// Element `flat` (row-major over the shape) of a possibly strided tensor.
Scalar& element(Tensor& t, int64_t flat) {
  int64_t off = 0;
  for (int d = t.rank() - 1; d >= 0; --d) {
    off += (flat % t.dim(d)) * t.strides()[d];
    flat /= t.dim(d);
  }
  return t.data()[off];
}

std::string index_string(const Shape& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.rank());
  for (int d = shape.rank() - 1; d >= 0; --d) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  std::ostringstream out;
  out << '(';
  for (size_t i = 0; i < idx.size(); ++i) out << (i ? ", " : "") << idx[i];
  out << ')';
  return out.str();
}

// L = sum_j y_j r_j in double; `magnitude` gets sum_j |y_j r_j|.
double weighted_sum(const Tensor& y, const Tensor& r, double* magnitude = nullptr) {
  const std::vector<Scalar> yv = y.to_vector(), rv = r.to_vector();
  double s = 0.0, m = 0.0;
  for (size_t i = 0; i < yv.size(); ++i) {
    s += static_cast<double>(yv[i]) * rv[i];
    m += std::abs(static_cast<double>(yv[i]) * rv[i]);
  }
  if (magnitude) *magnitude = m;
  return s;
}

// Float32 rounding of the outputs bounds what a difference of two
// evaluations can resolve: the output's own rounding (half a unit in the
// last place of sum_j |y_j r_j|) and the partial sums of a reduction that a
// one-element change reroutes. Four units cover both with a margin; more
// would hide a gradient 5% off in a large output.
constexpr double kFloatNoiseUnits = 4.0 * 0x1p-24;

}  // namespace

GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& opt) {
  std::vector<Var> vars;
  for (const Tensor& t : inputs) vars.emplace_back(t, true);
  return gradcheck_vars([&] { return f(vars); }, vars, opt);
}

GradcheckResult gradcheck_vars(const std::function<Var()>& f, const std::vector<Var>& vars_in,
                               const GradcheckOptions& opt) {
  std::vector<Var> vars = vars_in;
  for (const Var& v : vars) {
    TAPEFORMER_CHECK(v.defined() && v.requires_grad(), "gradcheck(", opt.label,
                     "): every checked Var must require grad");
    v.zero_grad();
  }

  // Analytic gradients on a local tape, so a caller's tape is untouched.
  Tensor upstream;
  {
    TapeScope scope;
    Var out = f();
    TAPEFORMER_CHECK(out.defined(), "gradcheck(", opt.label, "): function returned an undefined Var");
    // R: standard normal draws, except for a single output (a loss), where
    // R = 1. One small draw there (seed 0 gives -0.014) would shrink every
    // gradient below atol, and then a wrong backward would pass.
    if (out.numel() == 1) {
      upstream = Tensor::ones(out.shape());
    } else {
      upstream = Tensor::empty(out.shape());
      Rng(opt.seed).fill_normal(upstream, 0.0f, 1.0f);
    }
    TAPEFORMER_CHECK(out.requires_grad(), "gradcheck(", opt.label,
                     "): output does not depend on any input");
    backward(out, upstream);
  }

  const auto eval = [&]() {
    NoGradGuard no_grad;
    return weighted_sum(f().value(), upstream);
  };

  GradcheckResult result;
  if (opt.extrapolate) {
    NoGradGuard no_grad;
    double magnitude = 0.0;
    weighted_sum(f().value(), upstream, &magnitude);
    result.noise = kFloatNoiseUnits * magnitude;
  }
  // The central difference at step h, divided by the step actually taken
  // after rounding x + h and x - h to float.
  const auto central = [&](Scalar& v, Scalar saved, double h) {
    v = static_cast<Scalar>(saved + h);
    const double up_x = static_cast<double>(v);
    const double fp = eval();
    v = static_cast<Scalar>(saved - h);
    const double down_x = static_cast<double>(v);
    const double fm = eval();
    v = saved;
    return (fp - fm) / (up_x - down_x);
  };
  double worst_ratio = 0.0;
  for (size_t i = 0; i < vars.size(); ++i) {
    Tensor& x = vars[i].value();
    const Tensor analytic = vars[i].has_grad() ? vars[i].grad() : Tensor::zeros(x.shape());
    const std::vector<Scalar> a = analytic.to_vector();
    for (int64_t e = 0; e < x.numel(); ++e) {
      Scalar& v = element(x, e);
      const Scalar saved = v;
      double numeric = 0.0, noise_tol = 0.0;
      if (opt.extrapolate) {
        const double h = opt.rel_step * std::max(opt.step_floor, std::abs(static_cast<double>(saved)));
        const double coarse = central(v, saved, h), fine = central(v, saved, h / 2);
        numeric = (4.0 * fine - coarse) / 3.0;
        // An evaluation is off by up to `noise`, so D(h) by noise / h and
        // D(h/2) by 2 noise / h; the combination by 4/3 * 2 / h + 1/3 / h.
        noise_tol = 3.0 * result.noise / h;
      } else {
        numeric = central(v, saved, opt.eps);
      }
      // A non-finite gradient on either side (NaN, or an overflow that makes
      // err and tol both inf) is the worst failure there is; written so that
      // no comparison with NaN or inf can let it through.
      const bool finite = std::isfinite(a[e]) && std::isfinite(numeric);
      const double err = finite ? std::abs(a[e] - numeric) : INFINITY;
      const double tol = finite ? opt.atol + opt.rtol * std::abs(numeric) + noise_tol : 0.0;
      const double ratio = finite ? err / tol : INFINITY;
      if (err > result.max_abs_error) result.max_abs_error = err;
      ++result.checked;
      if (!(err <= tol) && (result.ok || ratio > worst_ratio)) {
        worst_ratio = ratio;
        std::ostringstream msg;
        msg << "gradcheck(" << opt.label << "): input " << i << " " << x.shape() << " element "
            << index_string(x.shape(), e) << ": analytic " << a[e] << " vs numeric " << numeric
            << " (|diff| " << err << " > tol " << tol << " = atol " << opt.atol << " + rtol "
            << opt.rtol << " * |numeric|" << (opt.extrapolate ? " + float noise " : "");
        if (opt.extrapolate) msg << noise_tol;
        msg << ")";
        result.ok = false;
        result.message = msg.str();
      }
    }
  }
  return result;
}

GradcheckResult gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs,
                          const std::string& label) {
  GradcheckOptions opt;
  opt.label = label;
  return gradcheck(f, inputs, opt);
}

}  // namespace tapeformer
