#include "tapeformer/layers/attention/rfa.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tapeformer/autograd/function.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/eigen.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"

namespace tapeformer {

namespace {

using RowMatrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using VectorMap = Eigen::Map<Eigen::Matrix<Scalar, Eigen::Dynamic, 1>>;
using ConstVectorMap = Eigen::Map<const Eigen::Matrix<Scalar, Eigen::Dynamic, 1>>;

constexpr int64_t kScanChunk = 32;  // the scan keeps its state every this many steps for the backward

// d~ = sign(d) max(|d|, 1e-4), sign(0) = +1.
Scalar clamped(Scalar d) {
  if (std::abs(d) >= kRfaMinDenominator) return d;
  return d < 0 ? -kRfaMinDenominator : kRfaMinDenominator;
}

// The shapes of one scan: BH rows (batch x heads) of T steps, C features, M values.
struct ScanShape {
  int64_t BH, T, C, M;
};

// One step of a row: S = g S + (1 - g) b v^T, z likewise (ungated, g null: S += b v^T).
void step(Scalar* S, Scalar* z, const Scalar* b, const Scalar* v, const Scalar* g, const ScanShape& s) {
  MatrixMap Sm(S, s.C, s.M);
  VectorMap zm(z, s.C);
  const ConstVectorMap bm(b, s.C), vm(v, s.M);
  if (g != nullptr) {
    const Scalar keep = *g, take = 1.0f - *g;
    Sm *= keep;
    Sm.noalias() += (take * bm) * vm.transpose();
    zm = keep * zm + take * bm;
  } else {
    Sm.noalias() += bm * vm.transpose();
    zm += bm;
  }
}

// One row's steps [t0, t1) from state (S, z), which they update: y_t = a_t^T S_t / d~_t, d_t saved.
void scan_row(Scalar* S, Scalar* z, const Scalar* a, const Scalar* b, const Scalar* v, const Scalar* g, Scalar* y,
              Scalar* den, int64_t t0, int64_t t1, const ScanShape& s) {
  for (int64_t t = t0; t < t1; ++t) {
    step(S, z, b + t * s.C, v + t * s.M, g == nullptr ? nullptr : g + t, s);
    const ConstVectorMap at(a + t * s.C, s.C);
    const Scalar d = at.dot(VectorMap(z, s.C));
    if (den != nullptr) den[t] = d;
    VectorMap(y + t * s.M, s.M).noalias() = (MatrixMap(S, s.C, s.M).transpose() * at) / clamped(d);
  }
}

// The scan as an op: inputs a, b (BH, T, C), v (BH, T, M) and, gated, g (BH, T).
struct RfaScan : Function {
  const char* name() const override { return "rfa_scan"; }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    const Tensor a = in[0].contiguous(), b = in[1].contiguous(), v = in[2].contiguous();
    const Tensor g = in.size() > 3 ? in[3].contiguous() : Tensor();
    const ScanShape s = shape_of(a, v);
    const int64_t chunks = (s.T + kScanChunk - 1) / kScanChunk, state = s.C * s.M + s.C;
    Tensor y = Tensor::empty(v.shape()), den = Tensor::empty({s.BH, s.T});
    Tensor saved = Tensor::empty({s.BH, chunks, state});  // the state before each chunk's first step
    parallel::parallel_for(s.BH, 1, [&](int64_t r0, int64_t r1) {
      std::vector<Scalar> Sz(static_cast<size_t>(state));
      for (int64_t r = r0; r < r1; ++r) {
        std::fill(Sz.begin(), Sz.end(), 0.0f);
        for (int64_t c = 0; c < chunks; ++c) {
          std::copy(Sz.begin(), Sz.end(), saved.data() + (r * chunks + c) * state);
          scan_row(Sz.data(), Sz.data() + s.C * s.M, a.data() + r * s.T * s.C, b.data() + r * s.T * s.C,
                   v.data() + r * s.T * s.M, g.defined() ? g.data() + r * s.T : nullptr, y.data() + r * s.T * s.M,
                   den.data() + r * s.T, c * kScanChunk, std::min(s.T, (c + 1) * kScanChunk), s);
        }
      }
    });
    ctx.save_for_backward({a, b, v, g, saved, den});
    return {y};
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const std::vector<Tensor>& sv = ctx.saved();
    const Tensor &a = sv[0], &b = sv[1], &v = sv[2], &g = sv[3], &saved = sv[4], &den = sv[5];
    const Tensor dy = dout[0].contiguous();
    const ScanShape s = shape_of(a, v);
    const int64_t chunks = (s.T + kScanChunk - 1) / kScanChunk, state = s.C * s.M + s.C;
    Tensor da = Tensor::zeros(a.shape()), db = Tensor::zeros(b.shape()), dv = Tensor::zeros(v.shape());
    Tensor dg = g.defined() ? Tensor::zeros(g.shape()) : Tensor();
    parallel::parallel_for(s.BH, 1, [&](int64_t r0, int64_t r1) {
      std::vector<Scalar> states(static_cast<size_t>((kScanChunk + 1) * state));  // S, z before and after each step
      std::vector<Scalar> dSz(static_cast<size_t>(state)), num(static_cast<size_t>(s.M));
      for (int64_t r = r0; r < r1; ++r) {
        const Scalar *ar = a.data() + r * s.T * s.C, *br = b.data() + r * s.T * s.C, *vr = v.data() + r * s.T * s.M;
        const Scalar* gr = g.defined() ? g.data() + r * s.T : nullptr;
        std::fill(dSz.begin(), dSz.end(), 0.0f);
        MatrixMap dS(dSz.data(), s.C, s.M);
        VectorMap dz(dSz.data() + s.C * s.M, s.C);
        for (int64_t c = chunks - 1; c >= 0; --c) {
          const int64_t t0 = c * kScanChunk, t1 = std::min(s.T, t0 + kScanChunk);
          const Scalar* start = saved.data() + (r * chunks + c) * state;
          std::copy(start, start + state, states.data());
          for (int64_t t = t0; t < t1; ++t) {  // states[i + 1]: after step t0 + i
            Scalar* next = states.data() + (t - t0 + 1) * state;
            std::copy(next - state, next, next);
            step(next, next + s.C * s.M, br + t * s.C, vr + t * s.M, gr == nullptr ? nullptr : gr + t, s);
          }
          for (int64_t t = t1 - 1; t >= t0; --t) {
            Scalar* now = states.data() + (t - t0 + 1) * state;
            const Scalar* before = now - state;
            const MatrixMap St(now, s.C, s.M);
            const VectorMap zt(now + s.C * s.M, s.C);
            const ConstVectorMap at(ar + t * s.C, s.C), bt(br + t * s.C, s.C), vt(vr + t * s.M, s.M);
            const ConstVectorMap dyt(dy.data() + (r * s.T + t) * s.M, s.M);
            const Scalar d = den.data()[r * s.T + t], dd = clamped(d);
            VectorMap numt(num.data(), s.M);
            numt.noalias() = St.transpose() * at;
            const Eigen::Matrix<Scalar, Eigen::Dynamic, 1> dnum = dyt / dd;
            const Scalar dden = dd == d ? -dyt.dot(numt) / (dd * dd) : 0.0f;  // no gradient where clamped
            VectorMap(da.data() + (r * s.T + t) * s.C, s.C).noalias() = St * dnum + zt * dden;
            dS.noalias() += at * dnum.transpose();
            dz += at * dden;
            const Scalar take = gr == nullptr ? 1.0f : 1.0f - gr[t];
            VectorMap(dv.data() + (r * s.T + t) * s.M, s.M).noalias() = take * (dS.transpose() * bt);
            VectorMap(db.data() + (r * s.T + t) * s.C, s.C).noalias() = take * (dS * vt + dz);
            if (gr != nullptr) {
              // dg_t = <dS_t, S_(t-1) - b_t v_t^T> + <dz_t, z_(t-1) - b_t>
              const Eigen::Map<const RowMatrix> Sp(before, s.C, s.M);
              const ConstVectorMap zp(before + s.C * s.M, s.C);
              dg.data()[r * s.T + t] = (dS.cwiseProduct(Sp)).sum() - bt.dot(dS * vt) + dz.dot(zp - bt);
              dS *= gr[t];
              dz *= gr[t];
            }
          }
        }
      }
    });
    std::vector<Tensor> grads = {da, db, dv};
    if (g.defined()) grads.push_back(dg);
    return grads;
  }

  static ScanShape shape_of(const Tensor& a, const Tensor& v) {
    return {a.dim(0), a.dim(1), a.dim(2), v.dim(2)};
  }
};

// sqrt(1 / F) [sin p, cos p] over the last axis.
struct RfaSinCos : Function {
  const char* name() const override { return "rfa_sincos"; }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    const Tensor p = in[0].contiguous();
    const int64_t F = p.dim(-1), rows = p.numel() / std::max<int64_t>(F, 1);
    Shape shape = p.shape();
    shape[-1] = 2 * F;
    Tensor out = Tensor::empty(shape);
    const Scalar scale = 1.0f / std::sqrt(static_cast<Scalar>(F));
    parallel::parallel_for(rows, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t f = 0; f < F; ++f) {
          const Scalar x = p.data()[r * F + f];
          out.data()[r * 2 * F + f] = scale * std::sin(x);
          out.data()[r * 2 * F + F + f] = scale * std::cos(x);
        }
    });
    ctx.save_for_backward({p});
    return {out};
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const Tensor& p = ctx.saved()[0];
    const Tensor g = dout[0].contiguous();
    const int64_t F = p.dim(-1), rows = p.numel() / std::max<int64_t>(F, 1);
    Tensor dp = Tensor::empty(p.shape());
    const Scalar scale = 1.0f / std::sqrt(static_cast<Scalar>(F));
    parallel::parallel_for(rows, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t f = 0; f < F; ++f) {
          const Scalar x = p.data()[r * F + f];
          dp.data()[r * F + f] =
              scale * (g.data()[r * 2 * F + f] * std::cos(x) - g.data()[r * 2 * F + F + f] * std::sin(x));
        }
    });
    return {dp};
  }
};

}  // namespace

Var rfa_sincos(const Var& p) { return Function::apply<RfaSinCos>({p})[0]; }

Var rfa_features(const Var& x, const Var& sigma, const Tensor& eps) {
  TAPEFORMER_CHECK(x.rank() == 4 && sigma.rank() == 2 && eps.rank() == 3 && sigma.dim(0) == x.dim(1) &&
                       sigma.dim(1) == x.dim(3) && eps.dim(0) == x.dim(1) && eps.dim(1) == x.dim(3),
                   "rfa_features: x ", x.shape(), " must be (B, H, T, D) with sigma ", sigma.shape(), " (H, D) and eps ",
                   eps.shape(), " (H, D, F)");
  const int64_t H = x.dim(1), D = x.dim(3);
  const Var norm = sqrt(add_scalar(sum(mul(x, x), {3}, /*keepdim=*/true), 1e-12f));  // (B, H, T, 1)
  const Var unit = div(x, norm);
  const Var scaled = div(unit, reshape(sigma, {1, H, 1, D}));                       // x~ / sigma
  const Var p = matmul(scaled, Var(eps.reshape({1, H, D, eps.dim(2)})));           // (B, H, T, F)
  return rfa_sincos(p);                                                              // (B, H, T, 2F)
}

Var rfa_scan(const Var& a, const Var& b, const Var& v, const Var& g) {
  TAPEFORMER_CHECK(a.rank() == 4 && b.shape() == a.shape() && v.rank() == 4 && v.dim(0) == a.dim(0) &&
                       v.dim(1) == a.dim(1) && v.dim(2) == a.dim(2),
                   "rfa_scan: features ", a.shape(), " and ", b.shape(), " must be (B, H, T, C) and values ", v.shape(),
                   " (B, H, T, M)");
  const int64_t B = a.dim(0), H = a.dim(1), T = a.dim(2), C = a.dim(3), M = v.dim(3);
  std::vector<Var> in = {reshape(contiguous(a), {B * H, T, C}), reshape(contiguous(b), {B * H, T, C}),
                         reshape(contiguous(v), {B * H, T, M})};
  if (g.defined()) {
    TAPEFORMER_CHECK(g.shape() == Shape({B, H, T}), "rfa_scan: the gate ", g.shape(), " must be (B, H, T) = (", B,
                     ", ", H, ", ", T, ")");
    in.push_back(reshape(contiguous(g), {B * H, T}));
  }
  return reshape(Function::apply<RfaScan>(in)[0], {B, H, T, M});
}

// ---- RfaState ------------------------------------------------------------------

RfaState::RfaState(int64_t batch_, int64_t heads, int64_t features, int64_t values)
    : S(Tensor::zeros({batch_ * heads, features, values})), z(Tensor::zeros({batch_ * heads, features})),
      batch(batch_) {}

void RfaState::reset() {
  S.fill(0.0f);
  z.fill(0.0f);
  seen = 0;
}

// ---- RandomFeatureAttention -------------------------------------------------------

RandomFeatureAttention::RandomFeatureAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng)
    : ProjectedAttention("RandomFeatureAttention", std::move(pos), cfg.n_embd, cfg.n_head, cfg.dropout),
      n_features(cfg.option_int("rfa_features")),
      gated(cfg.option_bool("rfa_gate")),
      redraw(cfg.option_bool("rfa_redraw")) {
  init_projections(cfg.bias, residual_init_std(cfg), rng);
  const int64_t D = n_embd / n_head;
  log_sigma = register_parameter("log_sigma", Tensor::zeros({n_head, D}));  // sigma = e^log_sigma = 1
  if (gated) {
    Tensor w = Tensor::empty({n_embd, n_head});  // linear's [in, out]
    rng.fill_normal(w, 0.0f, 0.02f);
    gate_w = register_parameter("gate_w", w);
    gate_b = register_parameter("gate_b", Tensor::full({n_head}, 2.0f));
  }
  Tensor draw = Tensor::empty({n_head, D, n_features});
  rng.fill_normal(draw, 0.0f, 1.0f);
  eval_draw = register_buffer("eval_draw", draw);
  draw_seed_ = rng.next_u64();  // the init stream: a replica or a resumed model draws the same
  train_draw = register_buffer("train_draw", Tensor::empty({n_head, D, n_features}));
  redraw_features(0);
}

void RandomFeatureAttention::redraw_features(int64_t step) {
  Rng rng(draw_seed_ ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(step + 1)));
  rng.fill_normal(train_draw, 0.0f, 1.0f);
}

bool RandomFeatureAttention::after_optimizer_step(int64_t step) {
  if (!redraw) return false;
  redraw_features(step);
  return true;  // a buffer changed: replicas copy it
}

Var RandomFeatureAttention::gate(const Var& x) const {
  return permute(sigmoid(linear(x, gate_w, gate_b)), {0, 2, 1});  // (B, T, H) -> (B, H, T)
}

std::pair<Var, Var> RandomFeatureAttention::features(const Var& q, const Var& k, int64_t q0,
                                                     const Tensor& draw) const {
  const PositionalLayer& pos = positional();
  const Var sigma = exp(log_sigma);  // (H, D), positive
  return {rfa_features(pos.rotate(q, q0), sigma, draw), rfa_features(pos.rotate(k, q0), sigma, draw)};
}

Var RandomFeatureAttention::forward(const Var& x, Rng& rng) const {
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd, "RandomFeatureAttention: input ", x.shape(),
                   " must be (B, T, ", n_embd, ")");
  const std::vector<Var> h = heads(x);  // q, k, v (B, H, T, D)
  const auto [a, b] = features(h[0], h[1], 0, is_training() && redraw ? train_draw : eval_draw);
  return output(rfa_scan(a, b, h[2], gated ? gate(x) : Var()), rng);  // (B, T, C)
}

std::unique_ptr<InferenceState> RandomFeatureAttention::make_state(int64_t batch, int64_t /*window*/) const {
  TAPEFORMER_CHECK(batch >= 1, "RandomFeatureAttention: batch size must be >= 1, got ", batch);
  return std::make_unique<RfaState>(batch, n_head, 2 * n_features, n_embd / n_head);
}

Var RandomFeatureAttention::forward(const Var& x, InferenceState& state) const {
  check_inference(x);
  RfaState& s = state_as<RfaState>(state, "RandomFeatureAttention", "RfaState");
  TAPEFORMER_CHECK(x.dim(0) == s.batch, "RandomFeatureAttention: input ", x.shape(), " has batch ", x.dim(0),
                   " but the state was made for ", s.batch);
  const int64_t B = x.dim(0), T = x.dim(1), D = n_embd / n_head, C = 2 * n_features;
  const std::vector<Var> h = heads(x);
  const auto [a, b] = features(h[0], h[1], s.seen, eval_draw);
  const Tensor ac = a.value().contiguous(), bc = b.value().contiguous(), vc = h[2].value().contiguous();
  const Tensor g = gated ? gate(x).value().contiguous() : Tensor();
  Tensor y = Tensor::empty({B, n_head, T, D});
  const ScanShape shape{B * n_head, T, C, D};
  parallel::parallel_for(B * n_head, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      scan_row(s.S.data() + r * C * D, s.z.data() + r * C, ac.data() + r * T * C, bc.data() + r * T * C,
               vc.data() + r * T * D, gated ? g.data() + r * T : nullptr, y.data() + r * T * D, nullptr, 0, T, shape);
  });
  s.seen += T;
  return output(Var(y));  // (B, T, C)
}

// ---- the registry entry ---------------------------------------------------------

AttentionKind rfa_attention_kind() {
  AttentionKind kind;
  kind.name = "rfa";
  kind.summary = "Random Feature Attention (Peng et al. 2021): random Fourier features of the normalised q and k, a "
                 "learned per-head sigma and, gated, a learned forget gate on the running sums (a recency bias); "
                 "trained as a scan, an RNN when generating";
  // Whole-model tests use 64 features: with few, d_t = phi(q) . z can sit near 0 and amplify rounding.
  kind.options = {{"rfa_features", int64_t{128}, "rfa: F, random features per head (2F feature values)", int64_t{64}},
                  {"rfa_gate", true, "rfa: the gated variant, S_t = g_t S_(t-1) + (1 - g_t) phi(k_t) v_t^T"},
                  {"rfa_redraw", true, "rfa: a fresh random draw after every optimizer step in training (false: the fixed eval draw)"}};
  kind.make = [](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) {
    return std::make_shared<RandomFeatureAttention>(cfg, std::move(pos), rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    const double C = static_cast<double>(cfg.n_embd), H = static_cast<double>(cfg.n_head);
    const double gate = cfg.option_bool("rfa_gate") ? H * C + H : 0.0;
    return ProjectedAttention::projection_parameters(cfg) + C + gate;  // + sigma (H x D = C), w_g, b_g
  };
  kind.check = [](const ModelConfig& cfg, const PositionalKind& pos) {
    TAPEFORMER_CHECK(!pos.needs.score_bias && !pos.needs.relative_terms, "model.positional \"", pos.name,
                     "\" does not combine with model.attention \"rfa\": it adds terms to the T x T attention scores, "
                     "which random feature attention never forms");
    TAPEFORMER_CHECK(cfg.option_int("rfa_features") >= 1, "model.rfa_features must be >= 1, got ",
                     cfg.option_int("rfa_features"));
  };
  return kind;
}

}  // namespace tapeformer
