// softmax_attention (the lean, FlashAttention-style kernel) against today's
// fused causal_attention and against the composition of primitive ops it
// replaces; its memory, thread determinism, causality and error messages.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/core/storage.h"
#include "expect_error.h"
#include "golden.h"
#include "op_runs.h"
#include "attention_calls.h"

using namespace tapeformer;
using namespace attention_calls;

namespace {

constexpr double kTol = 1e-5;  // |a - b| <= kTol * max(1, |b|); NaN fails
constexpr Scalar kInf = std::numeric_limits<Scalar>::infinity();

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const std::vector<Scalar> x = a.to_vector(), y = b.to_vector();
  return a.shape() == b.shape() && std::memcmp(x.data(), y.data(), x.size() * sizeof(Scalar)) == 0;
}

// The heads of a packed qkv (B, T, 3C) as strided (B, H, T, D) views: part 0
// is q, 1 is k, 2 is v. Gradients flow back into qkv through slice/reshape/permute.
Var head_view(const Var& qkv, int part, int64_t H) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  return permute(reshape(slice(qkv, 2, part * C, (part + 1) * C), {B, T, H, C / H}), {0, 2, 1, 3});
}

// softmax_attention on a packed qkv, heads merged back: (B, T, 3C) -> (B, T, C).
Var lean_on_qkv(const Var& qkv, int64_t H, Scalar p = 0, Rng* rng = nullptr) {
  const Var y = attend(head_view(qkv, 0, H), head_view(qkv, 1, H), head_view(qkv, 2, H), {}, true, p, rng);
  return reshape(permute(y, {0, 2, 1, 3}), {qkv.dim(0), qkv.dim(1), qkv.dim(2) / 3});
}

void check_runs_close(const Run& a, const Run& b, double tol = kTol) {
  check_close(a.y, b.y, "value", tol);
  for (size_t i = 0; i < a.grads.size(); ++i) {
    REQUIRE(a.grads[i].defined());
    REQUIRE(b.grads[i].defined());
    check_close(a.grads[i], b.grads[i], "gradient of input " + std::to_string(i), tol);
  }
}

// ---- the composed reference ----------------------------------------------

struct Case {
  int64_t B, H, Tq, Tk, D, Dv;
  bool causal;
  std::vector<Tensor> bias;
  Scalar p = 0;
  uint64_t rng_seed = 0;
};

// Sum of the bias terms, broadcast to (B, H, Tq, Tk), in the order given.
Tensor bias_sum(const Case& c) {
  Tensor sum = Tensor::zeros({c.B, c.H, c.Tq, c.Tk});
  for (size_t t = 0; t < c.bias.size(); ++t) {
    const Tensor e = c.bias[t].expand(sum.shape()).contiguous();
    sum = t == 0 ? e.clone() : add(Var(sum), Var(e)).value();
  }
  return sum;
}

// The dropout factors the op draws: the first u64 of a copy of its Rng seeds hash_uniform.
Tensor dropout_factors(const Case& c) {
  Rng rng(c.rng_seed);
  const uint64_t seed = rng.next_u64();
  std::vector<Scalar> f(c.B * c.H * c.Tq * c.Tk);
  for (size_t e = 0; e < f.size(); ++e) f[e] = hash_uniform(seed, e) >= c.p ? 1.0f / (1.0f - c.p) : 0.0f;
  return Tensor::from({c.B, c.H, c.Tq, c.Tk}, f);
}

// matmul, mul_scalar, add of the bias, masked_fill(-inf) for the causal mask,
// softmax, mul by the dropout mask, matmul. A row with no visible key would
// be softmax(-inf, ..., -inf) = NaN: its bias is replaced by 0 (finite) and
// its probabilities multiplied by 0, so it gives y = 0 and no gradient.
Var composed(const Case& c, const Var& q, const Var& k, const Var& v) {
  const int64_t off = c.Tk - c.Tq;
  std::vector<Scalar> future(c.Tq * c.Tk, 0.0f);
  for (int64_t i = 0; i < c.Tq; ++i)
    for (int64_t j = 0; j < c.Tk; ++j) future[i * c.Tk + j] = c.causal && j > off + i ? 1.0f : 0.0f;
  std::vector<Scalar> b = bias_sum(c).to_vector(), alive(c.B * c.H * c.Tq, 0.0f);
  for (int64_t r = 0; r < c.B * c.H * c.Tq; ++r) {
    for (int64_t j = 0; j < c.Tk; ++j)
      if (future[r % c.Tq * c.Tk + j] == 0 && std::isfinite(b[r * c.Tk + j])) alive[r] = 1.0f;
    if (alive[r] == 0)
      for (int64_t j = 0; j < c.Tk; ++j) b[r * c.Tk + j] = 0.0f;
  }
  Var s = mul_scalar(matmul(q, transpose(k, -1, -2)), 1.0f / std::sqrt(static_cast<Scalar>(c.D)));
  if (!c.bias.empty()) s = add(s, Var(Tensor::from({c.B, c.H, c.Tq, c.Tk}, b)));
  if (c.causal) s = masked_fill(s, Tensor::from({c.Tq, c.Tk}, future), -kInf);
  Var P = mul(softmax(s), Var(Tensor::from({c.B, c.H, c.Tq, 1}, alive)));
  if (c.p > 0) P = mul(P, Var(dropout_factors(c)));
  return matmul(P, v);
}

// softmax_attention vs composed on random q, k, v and upstream gradient;
// k is given as a transposed view (its last dim strided) when k_transposed.
void check_against_composed(const Case& c, uint64_t seed, bool k_transposed = false) {
  Rng rng(seed);
  const Tensor q = random({c.B, c.H, c.Tq, c.D}, rng);
  Tensor k = random({c.B, c.H, c.Tk, c.D}, rng);
  if (k_transposed) k = random({c.B, c.H, c.D, c.Tk}, rng).transpose(2, 3);
  const Tensor v = random({c.B, c.H, c.Tk, c.Dv}, rng);
  const Tensor R = random({c.B, c.H, c.Tq, c.Dv}, rng);
  auto lean = [&](const std::vector<Var>& x) {
    Rng dropout_rng(c.rng_seed);
    Var kk = x[1];
    if (k_transposed) kk = transpose(contiguous(transpose(x[1], 2, 3)), 2, 3);  // strided last dim again
    return attend(x[0], kk, x[2], c.bias, c.causal, c.p, c.p > 0 ? &dropout_rng : nullptr);
  };
  auto reference = [&](const std::vector<Var>& x) { return composed(c, x[0], x[1], x[2]); };
  check_runs_close(run(lean, {q, k, v}, R), run(reference, {q, k, v}, R));
}

}  // namespace

TEST_CASE("softmax_attention equals the fused causal_attention on the heads of a packed qkv") {
  struct Size {
    int64_t B, T, H, D;
  };
  // D = 16 and 12 (a partial packet); T = 37 (one tile), 200 (four tiles, the last partial).
  for (const Size sz : {Size{2, 37, 3, 16}, Size{2, 37, 2, 12}, Size{2, 200, 2, 16}}) {
    CAPTURE(sz.T);
    CAPTURE(sz.D);
    Rng rng(sz.T * 100 + sz.D);
    const int64_t C = sz.H * sz.D;
    const Tensor qkv = random({sz.B, sz.T, 3 * C}, rng);
    const Tensor R = random({sz.B, sz.T, C}, rng);
    {  // the heads really are strided views of qkv, no copies
      const Var x(qkv);
      CHECK(head_view(x, 1, sz.H).value().shares_storage(qkv));
      CHECK_FALSE(head_view(x, 1, sz.H).value().is_contiguous());
    }
    const Run lean = run([&](const std::vector<Var>& x) { return lean_on_qkv(x[0], sz.H); }, {qkv}, R);
    const Run fused = run([&](const std::vector<Var>& x) { return causal_attention(x[0], sz.H); }, {qkv}, R);
    check_runs_close(lean, fused);
  }
}

TEST_CASE("softmax_attention equals the composed reference: KV cache, non-causal, strided k") {
  // Tq = 5 queries after Tk - Tq = 7 cached keys; Dv != D. Then after 145
  // cached keys: one query tile against three key tiles.
  check_against_composed({2, 3, 5, 12, 8, 6, true, {}}, 1);
  check_against_composed({2, 3, 5, 150, 8, 6, true, {}}, 10);
  // Non-causal, Tq > Tk, k with a strided last dim (copied once by the op).
  check_against_composed({2, 2, 9, 7, 8, 5, false, {}}, 2, /*k_transposed=*/true);
  // Several tiles with Tk - Tq = 50, not a multiple of the tile.
  check_against_composed({1, 2, 100, 150, 16, 16, true, {}}, 3);
}

TEST_CASE("softmax_attention equals the composed reference with ALiBi's two bias terms") {
  const int64_t H = 3;
  for (const int64_t T : {int64_t{11}, int64_t{70}}) {
    CAPTURE(T);
    std::vector<Scalar> query_part(H * T), key_part(H * T);
    for (int64_t h = 0; h < H; ++h) {
      const Scalar slope = std::pow(2.0f, -2.0f * (h + 1));
      for (int64_t t = 0; t < T; ++t) query_part[h * T + t] = -slope * t, key_part[h * T + t] = slope * t;
    }
    // slope (j - i) = (-slope i) + (slope j): terms (1, H, T, 1) and (1, H, 1, T).
    const std::vector<Tensor> alibi = {Tensor::from({1, H, T, 1}, query_part), Tensor::from({1, H, 1, T}, key_part)};
    check_against_composed({2, H, T, T, 8, 8, true, alibi}, 4);
  }
}

TEST_CASE("softmax_attention: key and query padding with -inf; rows with every key masked give 0 and no gradient") {
  const int64_t B = 3, H = 2, Tq = 6, Tk = 9, D = 8;
  std::vector<Scalar> keys(B * Tk, 0.0f), queries(B * Tq, 0.0f);
  for (int64_t j = 6; j < Tk; ++j) keys[0 * Tk + j] = -kInf;  // batch 0: the last 3 keys are padding
  for (int64_t j = 0; j < Tk; ++j) keys[1 * Tk + j] = -kInf;  // batch 1: every key
  keys[2 * Tk + 0] = -kInf;                                   // batch 2: the first key
  // A (B, 1, Tq, 1) term is constant along a row, which softmax ignores unless
  // it is -inf: query 4 of batch 2 sees nothing.
  queries[2 * Tq + 4] = -kInf;
  const std::vector<Tensor> padding = {Tensor::from({B, 1, 1, Tk}, keys), Tensor::from({B, 1, Tq, 1}, queries)};
  check_against_composed({B, H, Tq, Tk, D, D, false, padding}, 5);
  // The dead rows exactly: y = 0 and gradients 0, never NaN.
  Rng rng(6);
  std::vector<Var> x = {Var(random({B, H, Tq, D}, rng), true), Var(random({B, H, Tk, D}, rng), true),
                        Var(random({B, H, Tk, D}, rng), true)};
  TapeScope tape;
  const Var y = attend(x[0], x[1], x[2], padding, false);
  backward(y, random(y.shape(), rng));
  auto is_zero = [](const Tensor& t) { return bitwise_equal(t.contiguous(), Tensor::zeros(t.shape())); };
  for (const Tensor& t : {y.value(), x[0].grad(), x[1].grad(), x[2].grad()}) CHECK(is_zero(t.slice(0, 1, 2)));
  CHECK(is_zero(y.value().slice(0, 2, 3).slice(2, 4, 5)));
  CHECK(is_zero(x[0].grad().slice(0, 2, 3).slice(2, 4, 5)));
  CHECK_FALSE(is_zero(y.value().slice(0, 2, 3).slice(2, 3, 4)));
  // Keys masked by padding get no gradient either (batch 0, keys 6..8).
  CHECK(is_zero(x[1].grad().slice(0, 0, 1).slice(2, 6, 9)));
  CHECK(is_zero(x[2].grad().slice(0, 0, 1).slice(2, 6, 9)));
}

TEST_CASE("softmax_attention with dropout equals the composed reference with the regenerated hash mask") {
  // The reference differentiates y = (P * mask) v by the chain rule, so equal
  // gradients show that the kernel's row term delta_i = dy_i . y_i is right
  // with dropout too (y_i = sum_j P~_ij v_j gives dy_i . y_i = sum_j P_ij dP_ij).
  // One tile, then several (Tk - Tq = 20) with a bias term.
  check_against_composed({2, 2, 7, 7, 8, 8, true, {}, 0.3f, 42}, 7);
  Rng rng(8);
  check_against_composed({1, 2, 90, 110, 8, 12, true, {random({1, 1, 90, 110}, rng)}, 0.3f, 43}, 9);

  // Read the mask off the op itself: q = k = 0 gives P = 1 / Tk, and v = I
  // makes y_ij = P~_ij = keep_ij / (Tk (1 - p)).
  const int64_t B = 2, H = 3, T = 64;
  const Scalar p = 0.3f;
  std::vector<Scalar> eye(B * H * T * T, 0.0f);
  for (int64_t r = 0; r < B * H; ++r)
    for (int64_t j = 0; j < T; ++j) eye[(r * T + j) * T + j] = 1.0f;
  const Var zero(Tensor::zeros({B, H, T, 8})), v(Tensor::from({B, H, T, T}, eye));
  Rng op_rng(99);
  const Tensor y = attend(zero, zero, v, {}, false, p, &op_rng).value().contiguous();
  const Tensor factors = dropout_factors({B, H, T, T, 8, T, false, {}, p, 99});
  const std::vector<Scalar> yv = y.to_vector(), fv = factors.to_vector();
  int64_t kept = 0, agree = 0;
  for (size_t e = 0; e < yv.size(); ++e) {
    kept += yv[e] != 0;
    agree += (yv[e] != 0) == (fv[e] != 0);
  }
  CHECK(agree == static_cast<int64_t>(yv.size()));
  const double fraction = static_cast<double>(kept) / yv.size();  // 24576 draws: sd 0.003
  CHECK(fraction == doctest::Approx(1.0 - p).epsilon(0.02 / (1.0 - p)));
  check_close(y, mul_scalar(Var(factors), 1.0f / T).value(), "P~ read through v = I", kTol);
}

TEST_CASE("softmax_attention keeps O(T D) for its backward, not the T x T probabilities, and frees it after") {
  const int64_t T = 2048, D = 32;
  Rng rng(10);
  const Var q(random({1, 1, T, D}, rng), true), k(random({1, 1, T, D}, rng), true), v(random({1, 1, T, D}, rng), true);
  const Tensor R = random({1, 1, T, D}, rng);
  const int64_t before = Storage::live_bytes();
  {
    TapeScope tape;
    const Var y = attend(q, k, v);
    // What the forward added: y and lse (q, k, v are the caller's).
    const int64_t kept = Storage::live_bytes() - before;
    const int64_t lean = (4 * T * D + T) * static_cast<int64_t>(sizeof(Scalar));  // q, k, v, y, lse
    CHECK(kept > 0);
    CHECK(kept <= 4 * lean);
    CHECK(kept * 16 < T * T * static_cast<int64_t>(sizeof(Scalar)));
    backward(y, R);
  }
  // The tape ran and was cleared, y is gone: only q, k, v's gradients remain.
  CHECK(Storage::live_bytes() - before == 3 * T * D * static_cast<int64_t>(sizeof(Scalar)));
}

TEST_CASE("softmax_attention: values and gradients are bit-identical with 1, 2 and 3 threads") {
  struct RestoreThreads {
    int n = parallel::num_threads();
    ~RestoreThreads() { parallel::set_num_threads(n); }
  } restore;
  Rng rng(11);
  const int64_t T = 300, H = 2;
  std::vector<Scalar> slopes(H * T);
  for (int64_t e = 0; e < H * T; ++e) slopes[e] = -0.01f * (e / T + 1) * (e % T);
  const std::vector<Tensor> alibi_keys = {Tensor::from({1, H, 1, T}, slopes)};
  struct Shape4 {
    int64_t B, H, Tq, Tk, D;
    Scalar p;
  };
  // One (b, h) over five tiles (parallel over tiles alone, two passes); many
  // heads of a single query tile (the one-pass backward).
  for (const Shape4 s : {Shape4{1, 1, T, T, 16, 0.2f}, Shape4{1, H, 150, T, 16, 0.0f}, Shape4{4, H, 40, 90, 8, 0.2f}}) {
    CAPTURE(s.Tq);
    const std::vector<Tensor> in = {random({s.B, s.H, s.Tq, s.D}, rng), random({s.B, s.H, s.Tk, s.D}, rng),
                                    random({s.B, s.H, s.Tk, s.D}, rng)};
    const Tensor R = random({s.B, s.H, s.Tq, s.D}, rng);
    const std::vector<Tensor> bias = s.H == H && s.Tk == T ? alibi_keys : std::vector<Tensor>{};
    auto f = [&](const std::vector<Var>& x) {
      Rng dropout_rng(5);
      return attend(x[0], x[1], x[2], bias, true, s.p, &dropout_rng);
    };
    parallel::set_num_threads(1);
    const Run one = run(f, in, R);
    for (int threads : {2, 3}) {
      CAPTURE(threads);
      parallel::set_num_threads(threads);
      const Run many = run(f, in, R);
      CHECK(bitwise_equal(many.y, one.y));
      for (size_t i = 0; i < in.size(); ++i) CHECK(bitwise_equal(many.grads[i], one.grads[i]));
    }
  }
}

TEST_CASE("softmax_attention is causal bit for bit: new q, k, v at position t leave every output before t unchanged") {
  const int64_t B = 2, T = 150, H = 2, C = 16;
  Rng rng(12);
  const Tensor qkv = random({B, T, 3 * C}, rng);
  const Tensor y0 = lean_on_qkv(Var(qkv), H).value().contiguous();
  for (const int64_t t : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, int64_t{100}, T - 1}) {
    CAPTURE(t);
    Tensor changed = qkv.clone();
    changed.slice(1, t, t + 1).copy_from(random({B, 1, 3 * C}, rng));
    const Tensor y1 = lean_on_qkv(Var(changed), H).value().contiguous();
    if (t > 0) CHECK(bitwise_equal(y1.slice(1, 0, t).contiguous(), y0.slice(1, 0, t).contiguous()));
    CHECK_FALSE(bitwise_equal(y1.slice(1, t, t + 1).contiguous(), y0.slice(1, t, t + 1).contiguous()));
  }
}

namespace {

Var ones(const Shape& s) { return Var(Tensor::ones(s), true); }

}  // namespace

TEST_CASE("softmax_attention: every guarded error names the op, the argument and the shapes") {
  const Var q = ones({2, 3, 5, 8}), k = ones({2, 3, 7, 8}), v = ones({2, 3, 7, 6});
  const Var q_rank3 = ones({3, 5, 8}), q_long = ones({2, 3, 9, 8});
  const Var k_narrow = ones({2, 3, 7, 4}), k_one_head = ones({2, 1, 7, 8}), v_short = ones({2, 3, 6, 6});
  const std::vector<Tensor> bias_bad_1 = {Tensor::zeros({1, 3, 5, 1}), Tensor::zeros({2, 3, 1, 5})};
  const std::vector<Tensor> bias_rank5 = {Tensor::zeros({1, 1, 1, 1, 7})}, bias_undefined = {Tensor()};
  Rng rng(1);
  expect_error([&] { attend(q_rank3, k, v); }, {"softmax_attention", "rank 4", "q [3, 5, 8]"});
  expect_error([&] { attend(q, k_narrow, v); },
               {"softmax_attention", "k must be", "q [2, 3, 5, 8]", "k [2, 3, 7, 4]"});
  expect_error([&] { attend(q, k_one_head, v); }, {"softmax_attention", "k must be", "k [2, 1, 7, 8]"});
  expect_error([&] { attend(q, k, v_short); },
               {"softmax_attention", "v must be", "k [2, 3, 7, 8]", "v [2, 3, 6, 6]"});
  expect_error([&] { attend(q, k, v, bias_bad_1); },
               {"softmax_attention", "bias term 1", "[2, 3, 1, 5]", "(B, H, Tq, Tk) = [2, 3, 5, 7]"});
  expect_error([&] { attend(q, k, v, bias_rank5); },
               {"softmax_attention", "bias term 0", "[1, 1, 1, 1, 7]"});
  expect_error([&] { attend(q, k, v, bias_undefined); }, {"softmax_attention", "bias term 0", "undefined"});
  expect_error([&] { attend(q, k, v, {}, true, 1.0f, &rng); }, {"softmax_attention", "dropout 1", "[0, 1)"});
  expect_error([&] { attend(q, k, v, {}, true, -0.5f, &rng); }, {"softmax_attention", "dropout -0.5"});
  expect_error([&] { attend(q, k, v, {}, true, 0.2f); },
               {"softmax_attention", "dropout 0.2", "needs an Rng"});
  expect_error([&] { attend(q_long, k, v); },
               {"softmax_attention", "Tq <= Tk", "q [2, 3, 9, 8]", "k [2, 3, 7, 8]"});
  expect_error([&] { attend(q, Var(), v); }, {"softmax_attention", "undefined"});
}
