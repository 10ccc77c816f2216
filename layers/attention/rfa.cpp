#include "tapeformer/layers/attention/rfa.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "tapeformer/autograd/function.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/recompute.h"
#include "tapeformer/core/eigen.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/matmul.h"
#include "tapeformer/core/kernels/vector_loops.h"
#include "tapeformer/core/parallel.h"

namespace tapeformer {

namespace {

using RowMatrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using VectorMap = Eigen::Map<Eigen::Matrix<Scalar, Eigen::Dynamic, 1>>;
using ConstVectorMap = Eigen::Map<const Eigen::Matrix<Scalar, Eigen::Dynamic, 1>>;
using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;
using ConstRowMap = Eigen::Map<const RowMatrix>;
using kernels::MatRef;

// The scan's products and row sums run through tapeformer's kernels, which
// sum in one order on every machine (Eigen's products pick their blocking
// and lane order by the vector width): views of matrices, P = X Y.
MatRef view(const Scalar* p, int64_t rows, int64_t cols) { return {p, rows, cols, cols, 1}; }
MatRef view(const RowMatrix& m) { return view(m.data(), m.rows(), m.cols()); }
MatRef view(const ConstRowMap& m) { return view(m.data(), m.rows(), m.cols()); }
MatRef column(const Scalar* v, int64_t n) { return {v, n, 1, 1, 1}; }
MatRef column(const Vector& v) { return column(v.data(), v.size()); }
MatRef tr(const MatRef& m) { return {m.data, m.cols, m.rows, m.col_stride, m.row_stride}; }
RowMatrix mm(const MatRef& x, const MatRef& y) {
  RowMatrix p(x.rows, y.cols);
  kernels::gemm_fp32(x, y, p.data(), y.cols, false);
  return p;
}
Vector mv(const MatRef& x, const MatRef& v) {
  Vector p(x.rows);
  kernels::gemm_fp32(x, v, p.data(), 1, false);
  return p;
}
// Row sums and column sums of a row-major matrix, each in one fixed order.
Vector row_sums(const RowMatrix& m) {
  Vector s(m.rows());
  for (int64_t i = 0; i < m.rows(); ++i) s[i] = kernels::vec::sum(m.data() + i * m.cols(), m.cols());
  return s;
}
Vector col_sums(const RowMatrix& m) {
  Vector s = Vector::Zero(m.cols());
  for (int64_t i = 0; i < m.rows(); ++i)
    for (int64_t j = 0; j < m.cols(); ++j) s[j] += m(i, j);
  return s;
}

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
  // Plain loops: one product and one add per element, the same on every width.
  const Scalar keep = g != nullptr ? *g : 1.0f, take = g != nullptr ? 1.0f - *g : 1.0f;
  for (int64_t i = 0; i < s.C; ++i) {
    Scalar* Si = S + i * s.M;
    const Scalar bi = take * b[i];
    if (g != nullptr) {
      for (int64_t j = 0; j < s.M; ++j) Si[j] = keep * Si[j] + bi * v[j];
      z[i] = keep * z[i] + bi;
    } else {
      for (int64_t j = 0; j < s.M; ++j) Si[j] += bi * v[j];
      z[i] += bi;
    }
  }
}

// One row's T steps from state (S, z), which they update: y_t = a_t^T S_t / d~_t (generation).
void scan_row(Scalar* S, Scalar* z, const Scalar* a, const Scalar* b, const Scalar* v, const Scalar* g, Scalar* y,
              const ScanShape& s) {
  for (int64_t t = 0; t < s.T; ++t) {
    step(S, z, b + t * s.C, v + t * s.M, g == nullptr ? nullptr : g + t, s);
    const Scalar d = kernels::vec::dot(a + t * s.C, z, s.C);
    VectorMap(y + t * s.M, s.M) = mv(tr(view(S, s.C, s.M)), column(a + t * s.C, s.C)) / clamped(d);
  }
}

// One chunk's gates, t, i in [0, n): P_t = prod_{k<=t} g_k (what the state entering the chunk keeps by
// step t), E_ti = prod_{i<k<=t} g_k and W_ti = (1 - g_i) E_ti for i <= t (what step i's b_i v_i^T weighs
// at step t), 0 above the diagonal; ungated (g null): P = 1 and E = W = 1 on and below the diagonal.
struct ChunkGates {
  Vector P;
  RowMatrix E, W;
  void make(const Scalar* g, int64_t n) {
    E = RowMatrix::Zero(n, n);
    if (g == nullptr) {
      P = Vector::Ones(n);
      for (int64_t t = 0; t < n; ++t) E.row(t).head(t + 1).setOnes();
      W = E;
      return;
    }
    Vector lp(n);  // log P
    for (int64_t t = 0; t < n; ++t) lp[t] = (t > 0 ? lp[t - 1] : 0.0f) + std::log(g[t]);
    P.resize(n);
    for (int64_t t = 0; t < n; ++t) P[t] = std::exp(lp[t]);
    W = RowMatrix::Zero(n, n);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i <= t; ++i) {
        E(t, i) = std::exp(lp[t] - lp[i]);
        W(t, i) = (1.0f - g[i]) * E(t, i);
      }
  }
};

// The scan as an op: inputs a, b (BH, T, C), v (BH, T, M) and, gated, g (BH, T). It runs chunk by
// chunk of kScanChunk steps in matrix form: with the state (S0, z0) entering a chunk,
//   NUM = diag(P) A S0 + (W o A B^T) V,   DEN = diag(P) A z0 + (W o A B^T) 1,   Y = NUM / d~(DEN)
//   S_end = P_(n-1) S0 + B^T diag(W_(n-1,.)) V,   z_end = P_(n-1) z0 + B^T W_(n-1,.)
// (the same sums as the step-by-step recurrence, in another order), keeping each chunk's S0, z0.
struct RfaScan : Function {
  explicit RfaScan(RfaClampCount* clamps) : clamps_(clamps) {}
  const char* name() const override { return "rfa_scan"; }
  RfaClampCount* clamps_;

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    const Tensor a = in[0].contiguous(), b = in[1].contiguous(), v = in[2].contiguous();
    const Tensor g = in.size() > 3 ? in[3].contiguous() : Tensor();
    const ScanShape s = shape_of(a, v);
    const int64_t chunks = (s.T + kScanChunk - 1) / kScanChunk, state = s.C * s.M + s.C;
    Tensor y = Tensor::empty(v.shape()), den = Tensor::empty({s.BH, s.T});
    Tensor saved = Tensor::empty({s.BH, chunks, state});  // the state entering each chunk
    std::atomic<int64_t> n_clamped{0};
    parallel::parallel_for(s.BH, 1, [&](int64_t r0, int64_t r1) {
      std::vector<Scalar> Sz(static_cast<size_t>(state));
      ChunkGates gates;
      int64_t mine = 0;  // clamped denominators of these rows
      for (int64_t r = r0; r < r1; ++r) {
        std::fill(Sz.begin(), Sz.end(), 0.0f);
        MatrixMap S0(Sz.data(), s.C, s.M);
        VectorMap z0(Sz.data() + s.C * s.M, s.C);
        for (int64_t c = 0; c < chunks; ++c) {
          std::copy(Sz.begin(), Sz.end(), saved.data() + (r * chunks + c) * state);
          const int64_t t0 = c * kScanChunk, n = std::min(s.T, t0 + kScanChunk) - t0;
          const ConstRowMap A(a.data() + (r * s.T + t0) * s.C, n, s.C), B(b.data() + (r * s.T + t0) * s.C, n, s.C);
          const ConstRowMap V(v.data() + (r * s.T + t0) * s.M, n, s.M);
          gates.make(g.defined() ? g.data() + r * s.T + t0 : nullptr, n);
          const RowMatrix Wm = gates.W.cwiseProduct(mm(view(A), tr(view(B))));  // (n, n)
          const RowMatrix num = gates.P.asDiagonal() * mm(view(A), view(S0.data(), s.C, s.M)) + mm(view(Wm), view(V));  // (n, M)
          const Vector d = gates.P.cwiseProduct(mv(view(A), column(z0.data(), s.C))) + row_sums(Wm);
          for (int64_t t = 0; t < n; ++t) {
            mine += std::abs(d[t]) < kRfaMinDenominator ? 1 : 0;
            den.data()[r * s.T + t0 + t] = d[t];
            VectorMap(y.data() + (r * s.T + t0 + t) * s.M, s.M) = num.row(t).transpose() / clamped(d[t]);
          }
          const Vector e = gates.W.row(n - 1).transpose();
          const RowMatrix eV = e.asDiagonal() * V;
          S0 = gates.P[n - 1] * S0 + mm(tr(view(B)), view(eV));
          z0 = gates.P[n - 1] * z0 + mv(tr(view(B)), column(e));
        }
      }
      n_clamped += mine;
    });
    if (clamps_ != nullptr) {
      clamps_->seen += s.BH * s.T;
      clamps_->clamped += n_clamped.load();
    }
    ctx.save_for_backward({a, b, v, g, saved, den});
    return {y};
  }

  // The chunks in reverse, with dS, dz the gradient of the state leaving the chunk (G = dY / d~,
  // h = dd, 0 where clamped; K = A B^T, Wm = W o K):
  //   dWm = G V^T + h 1^T,  dA = diag(P)(G S0^T + h z0^T) + (dWm o W) B,  dB = (dWm o W)^T A + diag(e)(V dS^T + 1 dz^T)
  //   dV = Wm^T G + diag(e) B dS,  dS0 = A^T diag(P) G + P_(n-1) dS,  dz0 = A^T (P o h) + P_(n-1) dz
  // and, gated, the gates through log P: dlogP_t = dP_t P_t + sum_i (W o dW)_ti - sum_t' (W o dW)_t't,
  // dlog g_k = sum_{t>=k} dlogP_t, dg = dlog g / g - du, du_i = sum_t (E o dW)_ti.
  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const std::vector<Tensor>& sv = ctx.saved();
    const Tensor &a = sv[0], &b = sv[1], &v = sv[2], &g = sv[3], &saved = sv[4], &den = sv[5];
    const Tensor dy = dout[0].contiguous();
    const ScanShape s = shape_of(a, v);
    const int64_t chunks = (s.T + kScanChunk - 1) / kScanChunk, state = s.C * s.M + s.C;
    Tensor da = Tensor::empty(a.shape()), db = Tensor::empty(b.shape()), dv = Tensor::empty(v.shape());
    Tensor dg = g.defined() ? Tensor::empty(g.shape()) : Tensor();
    parallel::parallel_for(s.BH, 1, [&](int64_t r0, int64_t r1) {
      RowMatrix dS(s.C, s.M);
      Vector dz(s.C);
      ChunkGates gates;
      for (int64_t r = r0; r < r1; ++r) {
        dS.setZero();
        dz.setZero();
        for (int64_t c = chunks - 1; c >= 0; --c) {
          const int64_t t0 = c * kScanChunk, n = std::min(s.T, t0 + kScanChunk) - t0, at = r * s.T + t0;
          const Scalar* start = saved.data() + (r * chunks + c) * state;
          const ConstRowMap S0(start, s.C, s.M);
          const ConstVectorMap z0(start + s.C * s.M, s.C);
          const ConstRowMap A(a.data() + at * s.C, n, s.C), B(b.data() + at * s.C, n, s.C);
          const ConstRowMap V(v.data() + at * s.M, n, s.M), dY(dy.data() + at * s.M, n, s.M);
          const Scalar* gc = g.defined() ? g.data() + at : nullptr;
          gates.make(gc, n);
          const RowMatrix K = mm(view(A), tr(view(B))), Wm = gates.W.cwiseProduct(K);
          const RowMatrix AS0 = mm(view(A), view(S0));
          const Vector Az0 = mv(view(A), column(z0.data(), s.C));
          const RowMatrix num = gates.P.asDiagonal() * AS0 + mm(view(Wm), view(V));
          RowMatrix G(n, s.M);
          Vector h(n);
          for (int64_t t = 0; t < n; ++t) {
            const Scalar d = den.data()[at + t], dd = clamped(d);
            G.row(t) = dY.row(t) / dd;
            // no gradient where clamped
            h[t] = dd == d ? -kernels::vec::dot(dY.data() + t * s.M, num.data() + t * s.M, s.M) / (dd * dd) : 0.0f;
          }
          const RowMatrix dWm = (mm(view(G), tr(view(V))).colwise() + h).triangularView<Eigen::Lower>();
          const RowMatrix dK = dWm.cwiseProduct(gates.W);
          const RowMatrix PG = gates.P.asDiagonal() * G;
          const Vector Ph = gates.P.cwiseProduct(h);
          const Vector e = gates.W.row(n - 1).transpose();
          const RowMatrix BdS = mm(view(B), view(dS));  // (n, M): b_i^T dS
          RowMatrix::MapType(da.data() + at * s.C, n, s.C) =
              mm(view(PG), tr(view(S0))) + Ph * z0.transpose() + mm(view(dK), view(B));
          RowMatrix::MapType(db.data() + at * s.C, n, s.C) =
              mm(tr(view(dK)), view(A)) + e.asDiagonal() * (mm(view(V), tr(view(dS))).rowwise() + dz.transpose());
          RowMatrix::MapType(dv.data() + at * s.M, n, s.M) = mm(tr(view(Wm)), view(G)) + e.asDiagonal() * BdS;
          if (gc != nullptr) {
            RowMatrix dW = dWm.cwiseProduct(K);
            const Vector Bdz = mv(view(B), column(dz));
            Vector dP(n);
            for (int64_t i = 0; i < n; ++i) {
              dW(n - 1, i) += kernels::vec::dot(BdS.data() + i * s.M, V.data() + i * s.M, s.M) + Bdz[i];  // de_i
              dP[i] = kernels::vec::dot(G.data() + i * s.M, AS0.data() + i * s.M, s.M) + h[i] * Az0[i];
            }
            dP[n - 1] += kernels::vec::dot(dS.data(), S0.data(), s.C * s.M) + kernels::vec::dot(dz.data(), z0.data(), s.C);
            const RowMatrix WdW = gates.W.cwiseProduct(dW);
            const Vector dlp = dP.cwiseProduct(gates.P) + row_sums(WdW) - col_sums(WdW);
            const Vector du = col_sums(gates.E.cwiseProduct(dW));
            Scalar dlog = 0;  // sum_{t >= k} dlp_t
            for (int64_t k = n - 1; k >= 0; --k) {
              dlog += dlp[k];
              dg.data()[at + k] = dlog / gc[k] - du[k];
            }
          }
          // The state entering the chunk: what the chunk's outputs and the state leaving it read of it.
          dS = mm(tr(view(A)), view(PG)) + gates.P[n - 1] * dS;
          dz = mv(tr(view(A)), column(Ph)) + gates.P[n - 1] * dz;
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

// sqrt(1 / F) [sin p, cos p] over the last axis, with Eigen's packet sin and cos; the backward
// reads the output itself: dp = g_sin o (sqrt(1 / F) cos p) - g_cos o (sqrt(1 / F) sin p).
struct RfaSinCos : Function {
  const char* name() const override { return "rfa_sincos"; }

  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    const Tensor p = in[0].contiguous();
    const int64_t F = p.dim(-1), rows = p.numel() / std::max<int64_t>(F, 1);
    Shape shape = p.shape();
    shape[-1] = 2 * F;
    Tensor out = Tensor::empty(shape);
    const Scalar scale = 1.0f / std::sqrt(static_cast<Scalar>(F));
    parallel::parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        // The packet sin and cos for every entry, tail included (Eigen's
        // maps send a row's unaligned ends through libm).
        using namespace Eigen::internal;
        using P = eigen::NativePacket;
        const P ps = pset1<P>(scale);
        const Scalar* x = p.data() + r * F;
        Scalar* o = out.data() + r * 2 * F;
        for (int64_t i = 0; i < F; i += eigen::kNativePacketSize) {
          const int64_t l = std::min<int64_t>(eigen::kNativePacketSize, F - i);
          const P v = eigen::load_upto<P>(x + i, l);
          eigen::store_upto<P>(o + i, pmul(ps, psin_float(v)), l);
          eigen::store_upto<P>(o + F + i, pmul(ps, pcos_float(v)), l);
        }
      }
    });
    ctx.save_for_backward({out});
    return {out};
  }

  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const Tensor& out = ctx.saved()[0];
    const Tensor g = dout[0].contiguous();
    const int64_t F = out.dim(-1) / 2, rows = out.numel() / std::max<int64_t>(2 * F, 1);
    Shape shape = out.shape();
    shape[-1] = F;
    Tensor dp = Tensor::empty(shape);
    parallel::parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const Scalar *o = out.data() + r * 2 * F, *gr = g.data() + r * 2 * F;
        eigen::array(dp.data() + r * F, F) = eigen::array(gr, F) * eigen::array(o + F, F) -
                                             eigen::array(gr + F, F) * eigen::array(o, F);
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

Var rfa_scan(const Var& a, const Var& b, const Var& v, const Var& g, RfaClampCount* clamps) {
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
  return reshape(Function::apply<RfaScan>(in, clamps)[0], {B, H, T, M});
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
  // The clamps are counted once, not again when recompute runs the forward a second time.
  return output(rfa_scan(a, b, h[2], gated ? gate(x) : Var(), recomputing() ? nullptr : &clamps_), rng);  // (B, T, C)
}

std::vector<std::pair<std::string, std::vector<double>>> RandomFeatureAttention::own_metrics() const {
  const int64_t seen = clamps_.seen.exchange(0), clamped = clamps_.clamped.exchange(0);
  return {{"clamped", {seen > 0 ? static_cast<double>(clamped) / static_cast<double>(seen) : 0.0}}};
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
               vc.data() + r * T * D, gated ? g.data() + r * T : nullptr, y.data() + r * T * D, shape);
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
    refuse_pair_terms(pos, PairTerms::scores, "rfa",
                      "it adds terms to the T x T attention scores, which random feature attention never forms");
    TAPEFORMER_CHECK(cfg.option_int("rfa_features") >= 1, "model.rfa_features must be >= 1, got ",
                     cfg.option_int("rfa_features"));
  };
  return kind;
}

}  // namespace tapeformer
