// Linear attention, the causal product and efficient attention (docs/math.md#linear-attention)
// against the explicit quadratic formulas evaluated in float64, recurrent
// against parallel, bitwise causality, memory, thread determinism and errors.
//
// Tolerance: an element passes when |got - expected| <= 1e-5 * max(1, |expected|)
// (tests/golden.h's check_close), for outputs and every input's gradient.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/linear_attention.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/core/storage.h"
#include "expect_error.h"
#include "golden.h"
#include "op_runs.h"

using namespace tapeformer;

namespace {

constexpr double kTol = 1e-5;        // float32 op vs float64 formula, relative to max(1, |expected|)
constexpr Scalar kEps = 1e-6f;       // linear attention's denominator eps
constexpr Scalar kNormEps = 1e-6f;   // added to |x| in the 1 + cos feature map

Tensor positive(const Shape& s, Rng& rng) {  // features in [0.5, 1.5)
  Tensor t = Tensor::empty(s);
  rng.fill_uniform(t, 0.5f, 1.5f);
  return t;
}

// ---- float64 reference ----------------------------------------------------------

// A (B, H, T, X) tensor in float64, row-major; slice s = b * H + h.
struct Dense {
  int64_t BH = 0, T = 0, X = 0;
  Shape shape;
  std::vector<double> v;
  explicit Dense(const Tensor& t) : BH(t.dim(0) * t.dim(1)), T(t.dim(2)), X(t.dim(3)), shape(t.shape()) {
    for (Scalar x : t.to_vector()) v.push_back(x);
  }
  Dense(const Shape& s) : BH(s[0] * s[1]), T(s[2]), X(s[3]), shape(s), v(static_cast<size_t>(s.numel())) {}
  double* row(int64_t s, int64_t t) { return v.data() + (s * T + t) * X; }
  const double* row(int64_t s, int64_t t) const { return v.data() + (s * T + t) * X; }
  Tensor tensor() const { return Tensor::from(shape, std::vector<Scalar>(v.begin(), v.end())); }
};

double dot(const double* x, const double* y, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

enum class Map { Elu1, Cos, Efficient };
const char* map_name(Map m) { return m == Map::Elu1 ? "elu+1" : m == Map::Cos ? "1+cos" : "efficient"; }
int64_t features(Map m, int64_t D) { return m == Map::Cos ? D + 1 : D; }

// phi(x) for the linear maps: elu(x) + 1, or [1, x / (|x| + eps)].
void phi(Map m, const double* x, int64_t D, double* out) {
  if (m == Map::Elu1) {
    for (int64_t c = 0; c < D; ++c) out[c] = x[c] > 0 ? x[c] + 1 : std::exp(x[c]);
    return;
  }
  const double n = std::sqrt(dot(x, x, D)) + kNormEps;
  out[0] = 1;
  for (int64_t c = 0; c < D; ++c) out[c + 1] = x[c] / n;
}
// dx += J_phi(x)^T dphi.
void phi_backward(Map m, const double* x, int64_t D, const double* dphi, double* dx) {
  if (m == Map::Elu1) {
    for (int64_t c = 0; c < D; ++c) dx[c] += dphi[c] * (x[c] > 0 ? 1 : std::exp(x[c]));
    return;
  }
  // x^ = x / (n + e): dx = dx^ / (n + e) - x (x . dx^) / (n (n + e)^2)
  const double n = std::sqrt(dot(x, x, D)), ne = n + kNormEps;
  const double xd = dot(x, dphi + 1, D);
  for (int64_t c = 0; c < D; ++c) dx[c] += dphi[c + 1] / ne - x[c] * xd / (n * ne * ne);
}

struct Reference {
  Dense y, dq, dk, dv;
};

// y for q, k (B, H, T, D), v (B, H, T, M) and the gradients of L = sum(y * R),
// from the explicit weights w_ij (j <= i when causal):
//   linear maps: w_ij = phi(q_i) . phi(k_j), y_i = sum_j w_ij v_j / (sum_j w_ij + eps);
//   efficient:   y_i = sum_d al_id sum_j e^{k_jd} v_j / sum_j e^{k_jd}, al_i = softmax(q_i).
Reference reference(Map map, const Dense& q, const Dense& k, const Dense& v, const Dense& R, bool causal) {
  Reference out{Dense(v.shape), Dense(q.shape), Dense(k.shape), Dense(v.shape)};
  const int64_t T = q.T, D = q.X, M = v.X;
  for (int64_t s = 0; s < q.BH; ++s) {
    auto last = [&](int64_t i) { return causal ? i : T - 1; };
    if (map == Map::Efficient) {
      // e_jd = e^{k_jd - K_d} with K_d the column max (it cancels); u_id = sum_j e_jd.
      std::vector<double> e(T * D), al(T * D), u(T * D, 0.0), rho(T * D, 0.0);
      for (int64_t d = 0; d < D; ++d) {
        double K = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < T; ++j) K = std::max(K, k.row(s, j)[d]);
        for (int64_t j = 0; j < T; ++j) e[j * D + d] = std::exp(k.row(s, j)[d] - K);
      }
      for (int64_t i = 0; i < T; ++i) {
        double mx = -std::numeric_limits<double>::infinity(), z = 0;
        for (int64_t d = 0; d < D; ++d) mx = std::max(mx, q.row(s, i)[d]);
        for (int64_t d = 0; d < D; ++d) z += al[i * D + d] = std::exp(q.row(s, i)[d] - mx);
        for (int64_t d = 0; d < D; ++d) al[i * D + d] /= z;
        for (int64_t d = 0; d < D; ++d)
          for (int64_t j = 0; j <= last(i); ++j) u[i * D + d] += e[j * D + d];
      }
      // y_i = sum_d al_id c_id, c_id = sum_j (e_jd / u_id) v_j; rho_id = R_i . c_id.
      for (int64_t i = 0; i < T; ++i)
        for (int64_t d = 0; d < D; ++d)
          for (int64_t j = 0; j <= last(i); ++j) {
            const double w = e[j * D + d] / u[i * D + d];
            for (int64_t c = 0; c < M; ++c) out.y.row(s, i)[c] += al[i * D + d] * w * v.row(s, j)[c];
            rho[i * D + d] += w * dot(R.row(s, i), v.row(s, j), M);
          }
      for (int64_t i = 0; i < T; ++i) {
        const double ar = dot(&al[i * D], &rho[i * D], D);
        for (int64_t d = 0; d < D; ++d) out.dq.row(s, i)[d] = al[i * D + d] * (rho[i * D + d] - ar);
      }
      // dv_j = sum_{i, d} al_id w_ijd R_i, dk_jd = sum_i al_id w_ijd (R_i . v_j - rho_id).
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j <= last(i); ++j) {
          const double rv = dot(R.row(s, i), v.row(s, j), M);
          for (int64_t d = 0; d < D; ++d) {
            const double aw = al[i * D + d] * e[j * D + d] / u[i * D + d];
            for (int64_t c = 0; c < M; ++c) out.dv.row(s, j)[c] += aw * R.row(s, i)[c];
            out.dk.row(s, j)[d] += aw * (rv - rho[i * D + d]);
          }
        }
      continue;
    }
    const int64_t C = features(map, D);
    std::vector<double> fa(T * C), fb(T * C), dfa(T * C, 0.0), dfb(T * C, 0.0), den(T, kEps);
    for (int64_t t = 0; t < T; ++t) {
      phi(map, q.row(s, t), D, &fa[t * C]);
      phi(map, k.row(s, t), D, &fb[t * C]);
    }
    auto w = [&](int64_t i, int64_t j) { return dot(&fa[i * C], &fb[j * C], C); };
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j <= last(i); ++j) {
        den[i] += w(i, j);
        for (int64_t c = 0; c < M; ++c) out.y.row(s, i)[c] += w(i, j) * v.row(s, j)[c];
      }
      for (int64_t c = 0; c < M; ++c) out.y.row(s, i)[c] /= den[i];
    }
    // dw_ij = R_i . (v_j - y_i) / den_i, dv_j = sum_i w_ij R_i / den_i.
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j <= last(i); ++j) {
        double dw = 0;
        for (int64_t c = 0; c < M; ++c) {
          dw += R.row(s, i)[c] * (v.row(s, j)[c] - out.y.row(s, i)[c]);
          out.dv.row(s, j)[c] += w(i, j) * R.row(s, i)[c] / den[i];
        }
        dw /= den[i];
        for (int64_t c = 0; c < C; ++c) {
          dfa[i * C + c] += dw * fb[j * C + c];
          dfb[j * C + c] += dw * fa[i * C + c];
        }
      }
    for (int64_t t = 0; t < T; ++t) {
      phi_backward(map, q.row(s, t), D, &dfa[t * C], out.dq.row(s, t));
      phi_backward(map, k.row(s, t), D, &dfb[t * C], out.dk.row(s, t));
    }
  }
  return out;
}

// ---- the ops under test -----------------------------------------------------------

Var feature_map(Map map, const Var& x) {
  if (map == Map::Elu1) return add_scalar(elu(x), 1.0f);
  const Var norm = add_scalar(sqrt(sum(mul(x, x), {-1}, true)), kNormEps);
  const Var ones(Tensor::ones({x.dim(0), x.dim(1), x.dim(2), 1}));
  return concat({ones, div(x, norm)}, -1);
}

// The attention under test on (B, T, H, X) leaves (the layout of a projection
// before the heads are split): q and k enter as (B, H, T, .) transposed views,
// v as a transposed view of columns [1, 1 + M) of a wider buffer. The linear
// maps' features are computed in the (B, T, H, C) layout and transposed too,
// so linear_attention sees strided inputs.
Var attention(Map map, const Var& qs, const Var& ks, const Var& vs, int64_t M, bool causal) {
  const Var v = transpose(slice(vs, 3, 1, 1 + M), 1, 2);
  if (map == Map::Efficient) return efficient_attention(transpose(qs, 1, 2), transpose(ks, 1, 2), v, causal);
  return linear_attention(transpose(feature_map(map, qs), 1, 2), transpose(feature_map(map, ks), 1, 2), v, causal,
                          kEps);
}

Tensor heads(const Tensor& stored) { return stored.transpose(1, 2); }
Tensor value_heads(const Tensor& stored, int64_t M) { return stored.slice(3, 1, 1 + M).transpose(1, 2); }

void check_against_reference(Map map, bool causal, int64_t T, uint64_t seed) {
  const int64_t B = 2, H = 3, D = 8, M = 5;
  Rng rng(seed);
  // Efficient attention's keys spread wider so the running max moves often.
  const Tensor qt = random({B, T, H, D}, rng), kt = random({B, T, H, D}, rng, map == Map::Efficient ? 3.0f : 1.0f);
  const Tensor vt = random({B, T, H, M + 2}, rng), R = random({B, H, T, M}, rng);
  Var q(qt, true), k(kt, true), v(vt, true), y;
  {
    TapeScope tape;
    y = attention(map, q, k, v, M, causal);
    backward(y, R);
  }
  const Reference ref = reference(map, Dense(heads(qt)), Dense(heads(kt)), Dense(value_heads(vt, M)), Dense(R), causal);
  const std::string what =
      std::string(map_name(map)) + (causal ? " causal" : " non-causal") + " T=" + std::to_string(T);
  check_close(y.value(), ref.y.tensor(), what + ": y", kTol);
  check_close(heads(q.grad()), ref.dq.tensor(), what + ": dq", kTol);
  check_close(heads(k.grad()), ref.dk.tensor(), what + ": dk", kTol);
  check_close(value_heads(v.grad(), M), ref.dv.tensor(), what + ": dv", kTol);
  // The padding columns around v's slice get no gradient.
  CHECK(v.grad().slice(3, 0, 1).to_vector() == std::vector<Scalar>(B * T * H, 0.0f));
}

// The causal product is an unnormalised sum with cancellation, so its float32
// error scales with the sum of the magnitudes of its terms, not with the
// result: an element passes when |got - expected| <= 1e-5 * max(1, magnitude),
// magnitude being the same sum over the absolute values of every term (a
// dropped or doubled term still fails unless it is ~1000x below average).
void check_close_scaled(const Tensor& actual, const Dense& expected, const Dense& magnitude, const std::string& what) {
  const std::vector<Scalar> got = actual.to_vector();
  REQUIRE(got.size() == expected.v.size());
  int64_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double ratio = std::abs(got[i] - expected.v[i]) / (kTol * std::max(1.0, magnitude.v[i]));
    if (!(ratio <= 1)) ++bad;
    worst = std::max(worst, ratio);
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " elements beyond 1e-5 * max(1, magnitude), worst ", worst, "x the bound");
}

// The naive double loop of the causal product and its gradients for L = sum(y * R):
//   y_i = sum_{j<=i} (a_i . b_j) v_j, da_i = sum_{j<=i} (R_i . v_j) b_j,
//   db_j = sum_{i>=j} (R_i . v_j) a_i, dv_j = sum_{i>=j} (a_i . b_j) R_i.
// On absolute values (abs = true) it gives each sum's magnitude. (The result's
// dq and dk hold da and db.)
Reference naive_causal_product(const Dense& a, const Dense& b, const Dense& v, const Dense& R, bool abs) {
  Reference out{Dense(v.shape), Dense(a.shape), Dense(b.shape), Dense(v.shape)};
  const int64_t T = a.T, C = a.X, M = v.X;
  auto f = [abs](double x) { return abs ? std::abs(x) : x; };
  for (int64_t s = 0; s < a.BH; ++s)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        double w = 0, rv = 0;
        for (int64_t c = 0; c < C; ++c) w += f(a.row(s, i)[c]) * f(b.row(s, j)[c]);
        for (int64_t c = 0; c < M; ++c) rv += f(R.row(s, i)[c]) * f(v.row(s, j)[c]);
        for (int64_t c = 0; c < M; ++c) {
          out.y.row(s, i)[c] += w * f(v.row(s, j)[c]);
          out.dv.row(s, j)[c] += w * f(R.row(s, i)[c]);
        }
        for (int64_t c = 0; c < C; ++c) {
          out.dq.row(s, i)[c] += rv * f(b.row(s, j)[c]);
          out.dk.row(s, j)[c] += rv * f(a.row(s, i)[c]);
        }
      }
  return out;
}

bool bits_equal(const std::vector<Scalar>& x, const std::vector<Scalar>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(Scalar)) == 0;
}

}  // namespace

TEST_CASE("the float64 reference's gradients equal float64 central differences (h = 1e-6)") {
  // The analytic reference gradients below are themselves checked here, so a
  // derivation error shared with the kernels cannot hide.
  const int64_t T = 9, D = 3, M = 2;
  for (Map map : {Map::Elu1, Map::Cos, Map::Efficient}) {
    for (bool causal : {true, false}) {
      Rng rng(7);
      std::vector<Dense> in = {Dense(random({1, 2, T, D}, rng)), Dense(random({1, 2, T, D}, rng)),
                               Dense(random({1, 2, T, M}, rng))};
      const Dense R(random({1, 2, T, M}, rng));
      auto loss = [&] {
        const Dense y = reference(map, in[0], in[1], in[2], R, causal).y;
        return dot(y.v.data(), R.v.data(), static_cast<int64_t>(y.v.size()));
      };
      const Reference ref = reference(map, in[0], in[1], in[2], R, causal);
      const Dense* grads[] = {&ref.dq, &ref.dk, &ref.dv};
      double worst = 0;
      for (size_t i = 0; i < 3; ++i) {
        for (size_t e = 0; e < in[i].v.size(); ++e) {
          const double x = in[i].v[e], h = 1e-6;
          in[i].v[e] = x + h;
          const double up = loss();
          in[i].v[e] = x - h;
          const double down = loss();
          in[i].v[e] = x;
          const double numeric = (up - down) / (2 * h);
          worst = std::max(worst, std::abs(grads[i]->v[e] - numeric) / std::max(1.0, std::abs(numeric)));
        }
      }
      INFO(map_name(map), causal ? " causal" : " non-causal");
      CHECK(worst < 1e-7);
    }
  }
}

TEST_CASE("causal linear attention (elu+1, 1+cos) and efficient attention equal the float64 masked formula") {
  // T = 64 is exactly one chunk, 70 crosses into a short second one, 150 ends in a partial third.
  uint64_t seed = 100;
  for (Map map : {Map::Elu1, Map::Cos, Map::Efficient})
    for (int64_t T : {1, 64, 70, 150}) check_against_reference(map, true, T, ++seed);
}

TEST_CASE("non-causal linear attention (elu+1, 1+cos) and efficient attention equal the float64 formula") {
  uint64_t seed = 200;
  for (Map map : {Map::Elu1, Map::Cos, Map::Efficient})
    for (int64_t T : {1, 70}) check_against_reference(map, false, T, ++seed);
}

TEST_CASE("compose first: linear_attention equals its masked-matmul composition, values and gradients") {
  // y = (W v) / (W 1 + eps), W = a b^T with the future (j > i) zeroed when causal.
  // Two float32 computations, each within 1e-5 of float64 above: compared to 2e-5.
  const int64_t B = 2, H = 2, T = 70, C = 5, M = 4;
  std::vector<Scalar> future(T * T);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) future[i * T + j] = j > i ? 1.0f : 0.0f;
  const Tensor mask = Tensor::from({T, T}, future);
  for (bool causal : {true, false}) {
    Rng rng(causal ? 250 : 251);
    const std::vector<Tensor> in = {positive({B, H, T, C}, rng), positive({B, H, T, C}, rng),
                                    random({B, H, T, M}, rng)};
    const Tensor R = random({B, H, T, M}, rng);
    auto run = [&](bool fused) {
      std::vector<Var> x;
      for (const Tensor& t : in) x.emplace_back(t.clone(), true);
      Var y;
      {
        TapeScope tape;
        if (fused) {
          y = linear_attention(x[0], x[1], x[2], causal, kEps);
        } else {
          Var w = matmul(x[0], transpose(x[1], 2, 3));  // (B, H, T, T)
          if (causal) w = masked_fill(w, mask, 0.0f);
          y = div(matmul(w, x[2]), add_scalar(sum(w, {-1}, true), kEps));
        }
        backward(y, R);
      }
      std::vector<Tensor> out = {y.value()};
      for (const Var& v : x) out.push_back(v.grad());
      return out;
    };
    const std::vector<Tensor> fused = run(true), composed = run(false);
    const char* names[] = {"y", "da", "db", "dv"};
    for (size_t i = 0; i < fused.size(); ++i)
      check_close(fused[i], composed[i], std::string(causal ? "causal " : "non-causal ") + names[i], 2e-5);
  }
}

TEST_CASE("causal_product equals the naive double loop, values and gradients, on strided inputs") {
  const int64_t B = 2, H = 3, C = 4, M = 5;
  for (int64_t T : {6, 70, 131}) {
    Rng rng(300 + T);
    // a as a transposed (B, T, H, C) buffer, b contiguous, v sliced out of a wider buffer.
    const Tensor at = positive({B, T, H, C}, rng), bt = positive({B, H, T, C}, rng);
    const Tensor vt = random({B, H, T, M + 3}, rng), R = random({B, H, T, M}, rng);
    Var a(at, true), b(bt, true), v(vt, true), y;
    {
      TapeScope tape;
      y = causal_product(transpose(a, 1, 2), b, slice(v, 3, 2, 2 + M));
      backward(y, R);
    }
    const Dense da(heads(at)), db(bt), dv(vt.slice(3, 2, 2 + M)), dR(R);
    const Reference ref = naive_causal_product(da, db, dv, dR, false), mag = naive_causal_product(da, db, dv, dR, true);
    const std::string what = "causal_product T=" + std::to_string(T);
    check_close_scaled(y.value(), ref.y, mag.y, what + ": y");
    check_close_scaled(heads(a.grad()), ref.dq, mag.dq, what + ": da");
    check_close_scaled(b.grad(), ref.dk, mag.dk, what + ": db");
    check_close_scaled(v.grad().slice(3, 2, 2 + M), ref.dv, mag.dv, what + ": dv");
  }
}

TEST_CASE("recurrent kernels fed token by token and in uneven pieces reproduce the parallel forward") {
  const int64_t B = 2, H = 2, T = 70, C = 6, M = 5, BH = B * H;
  Rng rng(400);
  const Tensor a = positive({B, H, T, C}, rng), b = positive({B, H, T, C}, rng), v = random({B, H, T, M}, rng);
  const Tensor q = random({B, H, T, C}, rng), k = random({B, H, T, C}, rng, 3.0f);
  Tensor lin, eff;
  {
    NoGradGuard no_grad;
    lin = linear_attention(Var(a), Var(b), Var(v), true, kEps).value();
    eff = efficient_attention(Var(q), Var(k), Var(v), true).value();
  }
  const std::vector<std::vector<int64_t>> schedules = {std::vector<int64_t>(T, 1), {5, 1, 1, 30, 33}};
  for (const auto& pieces : schedules) {
    CAPTURE(pieces.size());
    Tensor S = Tensor::zeros({BH, C, M}), z = Tensor::zeros({BH, C});
    Tensor U = Tensor::zeros({BH, C, M}), u = Tensor::zeros({BH, C});
    Tensor m = Tensor::full({BH, C}, -std::numeric_limits<Scalar>::infinity());
    int64_t t0 = 0;
    for (int64_t n : pieces) {
      auto part = [&](const Tensor& x) { return x.slice(2, t0, t0 + n).contiguous(); };
      const Tensor ap = part(a), bp = part(b), vp = part(v), qp = part(q), kp = part(k);
      Tensor ylin = Tensor::empty({B, H, n, M}), yeff = Tensor::empty({B, H, n, M});
      kernels::linear_attention_recurrent(S.data(), z.data(), ap.data(), bp.data(), ap.data(), bp.data(), vp.data(),
                                          ylin.data(), BH, n, C, M, kEps);
      kernels::efficient_attention_recurrent(U.data(), u.data(), m.data(), qp.data(), kp.data(), vp.data(),
                                             yeff.data(), BH, n, C, M);
      check_close(ylin, lin.slice(2, t0, t0 + n), "linear recurrent from t=" + std::to_string(t0), kTol);
      check_close(yeff, eff.slice(2, t0, t0 + n), "efficient recurrent from t=" + std::to_string(t0), kTol);
      t0 += n;
    }
    CHECK(t0 == T);
  }
}

TEST_CASE("recurrent linear attention with numerator features != denominator features equals num / den") {
  // RoPE rotates only the numerator's features: (a, b) may have any sign, (az, bz) stay positive.
  const int64_t B = 1, H = 3, T = 70, C = 4, M = 6, BH = B * H;
  Rng rng(500);
  const Tensor a = random({B, H, T, C}, rng), b = random({B, H, T, C}, rng);
  const Tensor az = positive({B, H, T, C}, rng), bz = positive({B, H, T, C}, rng), v = random({B, H, T, M}, rng);
  Tensor expected;
  {
    NoGradGuard no_grad;
    const Var num = causal_product(Var(a), Var(b), Var(v));
    const Var den = add_scalar(causal_product(Var(az), Var(bz), Var(Tensor::ones({B, H, T, 1}))), kEps);
    expected = div(num, den).value();
  }
  Tensor S = Tensor::zeros({BH, C, M}), z = Tensor::zeros({BH, C}), y = Tensor::empty({B, H, T, M});
  kernels::linear_attention_recurrent(S.data(), z.data(), a.data(), b.data(), az.data(), bz.data(), v.data(),
                                      y.data(), BH, T, C, M, kEps);
  check_close(y, expected, "recurrent (a, b) != (az, bz)", kTol);
}

TEST_CASE("causality, bitwise: changing position t leaves every output before t bit-identical") {
  const int64_t B = 2, H = 2, T = 150, C = 5, M = 7;
  using Op = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, Op>> ops = {
      {"linear_attention", [](const Tensor& a, const Tensor& b, const Tensor& v) {
         return linear_attention(Var(a), Var(b), Var(v), true, kEps).value();
       }},
      {"causal_product", [](const Tensor& a, const Tensor& b, const Tensor& v) {
         return causal_product(Var(a), Var(b), Var(v)).value();
       }},
      {"efficient_attention", [](const Tensor& q, const Tensor& k, const Tensor& v) {
         return efficient_attention(Var(q), Var(k), Var(v), true).value();
       }},
  };
  for (const auto& [name, op] : ops) {
    for (int64_t t : {100, 64}) {
      Rng rng(600 + t);
      const Tensor a = positive({B, H, T, C}, rng), b = positive({B, H, T, C}, rng), v = random({B, H, T, M}, rng);
      const Tensor y1 = op(a, b, v);
      // A large key at t: a chunk- or sequence-wide max would see it early.
      Tensor a2 = a.clone(), b2 = b.clone(), v2 = v.clone();
      a2.slice(2, t, t + 1).fill(7.0f);
      b2.slice(2, t, t + 1).fill(30.0f);
      v2.slice(2, t, t + 1).fill(-5.0f);
      const Tensor y2 = op(a2, b2, v2);
      INFO(name, " t=", t);
      CHECK(bits_equal(y1.slice(2, 0, t).to_vector(), y2.slice(2, 0, t).to_vector()));
      CHECK_FALSE(bits_equal(y1.slice(2, t, t + 1).to_vector(), y2.slice(2, t, t + 1).to_vector()));
    }
  }
}

TEST_CASE("memory: the causal forward keeps O(T (C + M)) bytes, never T x C x M, and backward frees them") {
  const int64_t T = 8192, C = 32, M = 32;
  Rng rng(700);
  Var a(positive({1, 1, T, C}, rng), true), b(positive({1, 1, T, C}, rng), true), v(random({1, 1, T, M}, rng), true);
  const Tensor R = random({1, 1, T, M}, rng);
  const int64_t cube = T * C * M * static_cast<int64_t>(sizeof(Scalar));
  const std::vector<std::pair<std::string, std::function<Var()>>> ops = {
      {"linear_attention", [&] { return linear_attention(a, b, v, true, kEps); }},
      {"causal_product", [&] { return causal_product(a, b, v); }},
      {"efficient_attention", [&] { return efficient_attention(a, b, v, true); }},
  };
  for (const auto& [name, op] : ops) {
    INFO(name);
    const int64_t before = Storage::live_bytes();
    {
      TapeScope tape;
      Var y = op();
      const int64_t held = Storage::live_bytes() - before;
      // y (T x M) and, for linear attention, den (T); the inputs are saved by handle.
      CHECK(held <= T * (M + 1) * static_cast<int64_t>(sizeof(Scalar)));
      CHECK(held * 16 < cube);
      backward(y, R);
      CHECK(a.has_grad());
    }
    for (const Var& x : {a, b, v}) x.zero_grad();
    CHECK(Storage::live_bytes() == before);
  }
}

TEST_CASE("1, 2 and 3 threads give bit-identical outputs and gradients") {
  const int64_t B = 2, H = 3, T = 150, C = 6, M = 5;
  Rng rng(800);
  const Tensor a = positive({B, H, T, C}, rng), b = positive({B, H, T, C}, rng), v = random({B, H, T, M}, rng);
  const Tensor R = random({B, H, T, M}, rng);
  auto run = [&] {
    std::vector<std::vector<Scalar>> out;
    for (int which = 0; which < 5; ++which) {
      Var x(a.clone(), true), y(b.clone(), true), w(v.clone(), true), o;
      TapeScope tape;
      switch (which) {
        case 0: o = linear_attention(x, y, w, true, kEps); break;
        case 1: o = linear_attention(x, y, w, false, kEps); break;
        case 2: o = causal_product(x, y, w); break;
        case 3: o = efficient_attention(x, y, w, true); break;
        default: o = efficient_attention(x, y, w, false); break;
      }
      backward(o, R);
      for (const Tensor& t : {o.value(), x.grad(), y.grad(), w.grad()}) out.push_back(t.to_vector());
    }
    return out;
  };
  parallel::set_num_threads(1);
  const auto one = run();
  for (int n : {2, 3}) {
    parallel::set_num_threads(n);
    const auto many = run();
    REQUIRE(many.size() == one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      INFO(n, " threads, result ", i);
      CHECK(bits_equal(many[i], one[i]));
    }
  }
  parallel::set_num_threads(0);
}

TEST_CASE("errors name the op, the argument and the shapes") {
  auto var = [](const Shape& s) { return Var(Tensor::ones(s), true); };
  // Rank of the features.
  expect_error([&] { causal_product(var({2, 6, 3}), var({2, 6, 3}), var({2, 6, 4})); },
               {"causal_product", "a must be (B, H, T, C)", "[2, 6, 3]"});
  expect_error([&] { efficient_attention(var({2, 1, 6, 3, 1}), var({2, 1, 6, 3, 1}), var({2, 1, 6, 4})); },
               {"efficient_attention", "q must be (B, H, T, C)", "[2, 1, 6, 3, 1]"});
  // b against a: C, T, H or B differ.
  expect_error([&] { linear_attention(var({2, 1, 6, 3}), var({2, 1, 6, 5}), var({2, 1, 6, 4})); },
               {"linear_attention", "b [2, 1, 6, 5]", "shape of a [2, 1, 6, 3]"});
  expect_error([&] { causal_product(var({2, 1, 6, 3}), var({2, 1, 7, 3}), var({2, 1, 6, 4})); },
               {"causal_product", "b [2, 1, 7, 3]", "a [2, 1, 6, 3]"});
  expect_error([&] { efficient_attention(var({2, 2, 6, 3}), var({1, 2, 6, 3}), var({2, 2, 6, 4}), false); },
               {"efficient_attention", "k [1, 2, 6, 3]", "q [2, 2, 6, 3]"});
  // v against a: rank, B, H or T.
  expect_error([&] { linear_attention(var({2, 1, 6, 3}), var({2, 1, 6, 3}), var({2, 6, 4})); },
               {"linear_attention", "v [2, 6, 4]", "(B, H, T, M)", "[2, 1, 6, 3]"});
  expect_error([&] { causal_product(var({2, 1, 6, 3}), var({2, 1, 6, 3}), var({2, 1, 5, 4})); },
               {"causal_product", "v [2, 1, 5, 4]", "a [2, 1, 6, 3]"});
  expect_error([&] { efficient_attention(var({2, 2, 6, 3}), var({2, 2, 6, 3}), var({2, 3, 6, 4})); },
               {"efficient_attention", "v [2, 3, 6, 4]", "q [2, 2, 6, 3]"});
  // eps: zero, negative, infinite, NaN.
  for (Scalar eps : {0.0f, -1.0f, std::numeric_limits<Scalar>::infinity(), std::numeric_limits<Scalar>::quiet_NaN()}) {
    std::ostringstream text;
    text << eps;
    expect_error([&] { linear_attention(var({1, 1, 2, 3}), var({1, 1, 2, 3}), var({1, 1, 2, 4}), true, eps); },
                 {"linear_attention", "eps must be finite and > 0", text.str()});
  }
  // Efficient attention's softmax over features needs a feature.
  expect_error([&] { efficient_attention(var({1, 1, 2, 0}), var({1, 1, 2, 0}), var({1, 1, 2, 4})); },
               {"efficient_attention", "at least one feature", "[1, 1, 2, 0]"});
  expect_error([&] { causal_product(Var(), var({1, 1, 2, 3}), var({1, 1, 2, 4})); }, {"causal_product", "undefined"});
}
