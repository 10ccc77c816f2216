// One line per op: every op in autograd/ops.h is gradchecked here, including
// broadcast cases, strided (transposed / sliced) inputs and rectangular shapes
// with distinct dims. A final test parses ops.h and fails if an op has no row.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>

#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/layers/attention/sparse.h"
#include "scale_gradient.h"
#include "attention_calls.h"

using namespace tapeformer;
using namespace attention_calls;
using V = const std::vector<Var>&;

namespace {

enum class Values { Any, Positive, AwayFromZero, Distinct };
enum class Layout { Contiguous, Transposed, Sliced };

struct In {
  Shape shape;
  Values values = Values::Any;
  Layout layout = Layout::Contiguous;
};

// The window pattern (sparse.h's "window" kind, written out): keys i - 5 < j <= i.
struct Window5 : SparsePattern {
  bool sees(int64_t i, int64_t j) const override { return j <= i && i - j < 5; }
  void candidates(int64_t i0, int64_t i1, std::vector<std::pair<int64_t, int64_t>>& r) const override {
    r.push_back({i0 - 4, i1});
  }
};

In any(Shape s) { return {s}; }
In pos(Shape s) { return {s, Values::Positive}; }
In away(Shape s) { return {s, Values::AwayFromZero}; }
In distinct(Shape s) { return {s, Values::Distinct}; }
In transposed(Shape s) { return {s, Values::Any, Layout::Transposed}; }  // last two dims swapped in memory
In sliced(Shape s) { return {s, Values::Any, Layout::Sliced}; }          // view into a wider buffer

// Fills t with values suited to the op: away from kinks and poles, no ties.
void fill(Tensor& t, Values kind, Rng& rng) {
  std::vector<Scalar> v(t.numel());
  for (auto& x : v) x = rng.uniform() * 2.0f - 1.0f;  // (-1, 1)
  if (kind == Values::Positive) for (auto& x : v) x = 0.5f + std::abs(x) * 1.5f;       // [0.5, 2)
  if (kind == Values::AwayFromZero) for (auto& x : v) x = (x < 0 ? -0.2f : 0.2f) + x;  // |x| >= 0.2
  if (kind == Values::Distinct) {
    // A shuffled ladder with gaps of 0.1 >> the finite-difference step: no ties.
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<Scalar>(i) - 0.05f * v.size();
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
  }
  t.copy_from(Tensor::from(t.shape(), v));
}

Tensor make(const In& in, Rng& rng) {
  Tensor t;
  if (in.layout == Layout::Transposed) {
    Shape s = in.shape;
    std::swap(s[-1], s[-2]);
    t = Tensor::empty(s).transpose(-1, -2);
  } else if (in.layout == Layout::Sliced) {
    Shape s = in.shape;
    s[-1] += 3;
    t = Tensor::empty(s).slice(-1, 1, 1 + in.shape[-1]);
  } else {
    t = Tensor::empty(in.shape);
  }
  fill(t, in.values, rng);
  if (in.layout != Layout::Contiguous) REQUIRE_FALSE(t.is_contiguous());
  return t;
}

struct Row {
  std::string name;  // op name as declared in ops.h, then a description
  std::vector<In> inputs;
  GradcheckFn f;
  double eps = 1e-3;  // the finite-difference step (GradcheckOptions::eps)
};

IndexTensor ids(Shape s, std::vector<int32_t> v) { return IndexTensor(s, std::move(v)); }

Tensor mask_345() {  // [4, 5] pattern of 0/1, broadcast over the leading 3
  std::vector<Scalar> m(20);
  for (int i = 0; i < 20; ++i) m[i] = (i * 7 % 3 == 0) ? 1.0f : 0.0f;
  return Tensor::from({4, 5}, m);
}

const std::vector<Row>& table() {
  static const std::vector<Row> rows = {
      // ---- elementwise ----
      {"add", {any({3, 4, 5}), any({3, 4, 5})}, [](V v) { return add(v[0], v[1]); }},
      {"add broadcast [3,4,5]+[4,1]", {any({3, 4, 5}), any({4, 1})}, [](V v) { return add(v[0], v[1]); }},
      {"add transposed + sliced", {transposed({3, 4, 5}), sliced({3, 4, 5})}, [](V v) { return add(v[0], v[1]); }},
      {"sub broadcast [5]-[3,4,5]", {any({5}), any({3, 4, 5})}, [](V v) { return sub(v[0], v[1]); }},
      {"mul", {any({3, 4, 5}), transposed({3, 4, 5})}, [](V v) { return mul(v[0], v[1]); }},
      {"mul broadcast [3,1,5]*[1,4,1]", {any({3, 1, 5}), any({1, 4, 1})}, [](V v) { return mul(v[0], v[1]); }},
      {"div", {any({3, 4, 5}), away({3, 4, 5})}, [](V v) { return div(v[0], v[1]); }},
      {"div broadcast [3,4,5]/[5]", {any({3, 4, 5}), away({5})}, [](V v) { return div(v[0], v[1]); }},
      {"neg", {sliced({3, 4})}, [](V v) { return neg(v[0]); }},
      {"add_scalar", {any({3, 4})}, [](V v) { return add_scalar(v[0], 2.5f); }},
      {"mul_scalar", {transposed({3, 4})}, [](V v) { return mul_scalar(v[0], -1.5f); }},
      {"operators x*2 - 1/y + y/3", {any({3, 4}), pos({3, 4})}, [](V v) { return v[0] * 2.0f - 1.0f / v[1] + v[1] / 3.0f; }},
      {"exp", {any({3, 4, 5})}, [](V v) { return exp(v[0]); }},
      {"exp sliced", {sliced({3, 4, 5})}, [](V v) { return exp(v[0]); }},
      {"log", {pos({3, 4, 5})}, [](V v) { return log(v[0]); }},
      {"sqrt", {pos({3, 4, 5})}, [](V v) { return sqrt(v[0]); }},
      {"pow p=3", {any({3, 4})}, [](V v) { return pow(v[0], 3.0f); }},
      {"pow p=-1.5", {pos({3, 4})}, [](V v) { return pow(v[0], -1.5f); }},
      {"tanh", {any({3, 4, 5})}, [](V v) { return tanh(v[0]); }},
      {"sigmoid", {transposed({3, 4, 5})}, [](V v) { return sigmoid(mul_scalar(v[0], 3.0f)); }},
      {"relu", {away({3, 4, 5})}, [](V v) { return relu(v[0]); }},
      {"gelu", {any({3, 4, 5})}, [](V v) { return gelu(mul_scalar(v[0], 3.0f)); }},
      {"silu", {sliced({3, 4, 5})}, [](V v) { return silu(mul_scalar(v[0], 4.0f)); }},
      {"elu alpha=1", {away({3, 4, 5})}, [](V v) { return elu(mul_scalar(v[0], 2.0f)); }},
      {"elu alpha=0.5", {away({3, 4})}, [](V v) { return elu(v[0], 0.5f); }},
      {"where broadcast cond [4,5]", {any({3, 4, 5}), any({5})}, [](V v) { return where(mask_345(), v[0], v[1]); }},
      {"masked_fill", {any({3, 4, 5})}, [](V v) { return masked_fill(v[0], mask_345(), -3.0f); }},
      {"dropout p=0.4", {any({3, 4, 5})}, [](V v) { Rng rng(11); return dropout(v[0], 0.4f, rng); }},
      {"expand [4,1]->[3,4,5]", {any({4, 1})}, [](V v) { return expand(v[0], {3, 4, 5}); }},
      {"sum_to [3,4,5]->[4,1]", {any({3, 4, 5})}, [](V v) { return sum_to(v[0], {4, 1}); }},
      // ---- reductions ----
      {"sum axes {0,2}", {any({3, 4, 5})}, [](V v) { return sum(v[0], {0, 2}); }},
      {"sum axis -1 keepdim, transposed", {transposed({3, 4, 5})}, [](V v) { return sum(v[0], {-1}, true); }},
      {"sum all", {sliced({3, 4})}, [](V v) { return sum(v[0]); }},
      {"mean axis 1 keepdim", {any({3, 4, 5})}, [](V v) { return mean(v[0], {1}, true); }},
      {"mean all", {any({3, 4})}, [](V v) { return mean(v[0]); }},  // 12 elements: gradients 1/12 >> atol
      {"max axis 1", {distinct({3, 4, 5})}, [](V v) { return max(v[0], 1); }},
      {"max axis -1 keepdim", {distinct({3, 4, 5})}, [](V v) { return max(v[0], -1, true); }},
      {"max axes {0,2}", {distinct({3, 4, 5})}, [](V v) { return max(v[0], std::vector<int>{0, 2}); }},
      {"cumsum axis 1", {any({3, 4, 5})}, [](V v) { return cumsum(v[0], 1); }},
      {"cumsum axis -1 transposed", {transposed({3, 4, 5})}, [](V v) { return cumsum(v[0], -1); }},
      // ---- shape ----
      {"reshape", {any({3, 4, 5})}, [](V v) { return reshape(v[0], {5, -1}); }},
      {"reshape of transposed (copies)", {transposed({3, 4, 5})}, [](V v) { return reshape(v[0], {4, 15}); }},
      {"transpose", {any({3, 4, 5})}, [](V v) { return transpose(v[0], 0, 2); }},
      {"permute", {any({3, 4, 5})}, [](V v) { return permute(v[0], {2, 0, 1}); }},
      {"slice", {any({3, 4, 5})}, [](V v) { return slice(v[0], 1, 1, 3); }},
      {"slice negative bounds", {any({3, 4, 5})}, [](V v) { return slice(v[0], -1, -4, -1); }},
      {"concat axis 1", {any({3, 2, 5}), transposed({3, 4, 5})}, [](V v) { return concat({v[0], v[1]}, 1); }},
      {"split axis -1", {any({3, 4, 5})}, [](V v) {
         auto p = split(v[0], {2, 3}, -1);
         return concat({mul_scalar(p[1], 2.0f), p[0]}, -1);
       }},
      {"contiguous", {transposed({3, 4, 5})}, [](V v) { return contiguous(v[0]); }},
      {"split_heads 2 heads, q and v weighted, k unused", {any({2, 3, 12})}, [](V v) {
         const std::vector<Var> h = split_heads(v[0], 2);  // (2, 2, 3, 2) each
         return concat({mul_scalar(h[0], 2.0f), h[2]}, 3);
       }},
      {"split_heads sliced qkv", {sliced({2, 3, 6})}, [](V v) {
         const std::vector<Var> h = split_heads(v[0], 1);
         return concat({h[1], h[0], mul_scalar(h[2], -1.0f)}, 2);
       }},
      // ---- linear algebra ----
      {"matmul 2-D", {any({3, 4}), any({4, 5})}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul 3-D x 2-D", {any({2, 3, 4}), any({4, 5})}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul transposed operands", {transposed({3, 4}), transposed({4, 5})}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul batch broadcast [2,1,3,4]x[3,4,5]", {any({2, 1, 3, 4}), any({3, 4, 5})}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul 4-D transposed rhs", {any({2, 3, 4, 5}), transposed({2, 3, 5, 6})}, [](V v) { return matmul(v[0], v[1]); }},
      {"linear with bias", {any({3, 4, 5}), any({5, 6}), any({6})}, [](V v) { return linear(v[0], v[1], v[2]); }},
      {"linear no bias, transposed weight", {sliced({3, 5}), transposed({5, 6})}, [](V v) { return linear(v[0], v[1], Var()); }},
      // F = 20 and N = 6: a whole packet and partial ones in both GEMMs' epilogues.
      {"feed_forward gelu with biases", {any({2, 3, 5}), any({5, 20}), any({20}), any({20, 6}), any({6})},
       [](V v) { return feed_forward(v[0], v[1], v[2], v[3], v[4], Activation::Gelu); }},
      {"feed_forward relu no bias, transposed weights", {sliced({3, 5}), transposed({5, 7}), transposed({7, 4})},
       [](V v) { return feed_forward(v[0], v[1], Var(), v[2], Var(), Activation::Relu); }},
      {"feed_forward silu with biases", {any({2, 3, 5}), any({5, 20}), any({20}), any({20, 6}), any({6})},
       [](V v) { return feed_forward(v[0], v[1], v[2], v[3], v[4], Activation::Silu); }},
      {"matmul 2-D x 3-D", {sliced({3, 4}), any({2, 4, 5})}, [](V v) { return matmul(v[0], v[1]); }},
      // ---- gates ----
      {"gru_gate (B, T, C) with its weights", {any({2, 3, 4}), any({2, 3, 4}), any({4, 12}), any({4, 8}), any({4, 4}), any({4})},
       [](V v) { return gru_gate(v[0], mul_scalar(v[1], 2.0f), v[2], v[3], v[4], v[5]); }},
      {"gru_gate transposed x, 2-D", {transposed({3, 5}), any({3, 5}), any({5, 15}), any({5, 10}), transposed({5, 5}), any({5})},
       [](V v) { return gru_gate(v[0], v[1], v[2], v[3], v[4], v[5]); }},
      // ---- positional ----
      {"rotary (B, H, T, D) axis 2 from position 3", {any({2, 3, 5, 6})}, [](V v) { return rotary(v[0], 2, 3); }},
      {"rotary odd width, axis 0 of (T, H, D), transposed", {transposed({4, 2, 5})},
       [](V v) { return rotary(mul_scalar(v[0], 2.0f), 0, 0, 100.0f); }},
      {"relative_gather K=2 into Tk=6 after 2 cached keys", {any({2, 4, 5})}, [](V v) { return relative_gather(v[0], 6, 2, 0); }},
      {"relative_gather sliced, window starting at key 1", {sliced({3, 3})}, [](V v) { return relative_gather(v[0], 4, 3, 1); }},
      {"relative_scatter K=1, (2, 4, 6)", {any({2, 4, 6})}, [](V v) { return relative_scatter(v[0], 1, 2, 0); }},
      // ---- neural-network ----
      {"softmax", {any({3, 4, 5})}, [](V v) { return softmax(mul_scalar(v[0], 2.0f)); }},
      {"softmax transposed", {transposed({3, 4, 5})}, [](V v) { return softmax(v[0]); }},
      {"log_softmax", {any({3, 4, 5})}, [](V v) { return log_softmax(mul_scalar(v[0], 2.0f)); }},
      {"layer_norm affine", {any({3, 4, 5}), any({5}), any({5})}, [](V v) { return layer_norm(v[0], v[1], v[2]); }},
      {"layer_norm no affine, sliced", {sliced({3, 4, 5})}, [](V v) { return layer_norm(v[0], Var(), Var()); }},
      {"rms_norm", {any({3, 4, 5}), any({5})}, [](V v) { return rms_norm(v[0], v[1]); }},
      {"rms_norm transposed", {transposed({3, 4, 5})}, [](V v) { return rms_norm(v[0], Var()); }},
      {"cross_entropy with ignore_index", {any({3, 4, 7})}, [](V v) {
         return cross_entropy(mul_scalar(v[0], 2.0f),
                              ids({3, 4}, {0, 6, 3, -100, 2, 2, 5, 1, -100, 4, 0, 6}));
       }},
      {"cross_entropy 2-D", {transposed({5, 6})}, [](V v) { return cross_entropy(v[0], ids({5}, {5, 0, 3, 3, 1})); }},
      {"causal_attention 2 heads", {any({2, 5, 12})}, [](V v) { return causal_attention(mul_scalar(v[0], 2.0f), 2); }},
      {"causal_attention with dropout, sliced", {sliced({2, 4, 6})}, [](V v) {
         Rng rng(3);
         return causal_attention(v[0], 1, 0.3f, &rng);
       }},
      {"softmax_attention causal after a cached key, transposed k, Dv != D", {any({2, 2, 5, 4}), transposed({2, 2, 6, 4}), any({2, 2, 6, 3})},
       [](V v) { return attend(mul_scalar(v[0], 2.0f), v[1], v[2]); }},
      {"softmax_attention non-causal, ALiBi terms + key padding -inf, sliced v", {any({2, 2, 4, 3}), any({2, 2, 5, 3}), sliced({2, 2, 5, 4})},
       [](V v) {
         const Tensor rows = Tensor::from({1, 2, 4, 1}, {0.0f, -0.5f, -1.0f, -1.5f, 0.0f, -0.25f, -0.5f, -0.75f});
         const Tensor cols = Tensor::from({1, 2, 1, 5}, {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 0.0f, 0.25f, 0.5f, 0.75f, 1.0f});
         const Scalar inf = std::numeric_limits<Scalar>::infinity();
         const Tensor padding = Tensor::from({2, 1, 1, 5}, {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, -inf, -inf});
         return attend(mul_scalar(v[0], 2.0f), v[1], v[2], {rows, cols, padding}, false);
       }},
      {"softmax_attention dropout p=0.3", {any({1, 2, 5, 4}), any({1, 2, 5, 4}), any({1, 2, 5, 4})}, [](V v) {
         Rng rng(3);
         return attend(mul_scalar(v[0], 2.0f), v[1], v[2], {}, true, 0.3f, &rng);
       }},
      // A window of 5 over 70 positions: two query tiles, partial (masked) tiles and a skipped one.
      {"softmax_attention block mask: window 5, T = 70 (two tiles), transposed k",
       {any({1, 2, 70, 3}), transposed({1, 2, 70, 3}), any({1, 2, 70, 2})}, [](V v) {
         static const auto tiles = tile_pattern(Window5(), 70, 70, 0, 0);
         return attend_blocks(mul_scalar(v[0], 2.0f), v[1], v[2], tiles);
       }},
      {"softmax_attention block mask + DistanceTerm (H, 5), learned (adaptive span's soft mask)",
       {any({1, 2, 70, 3}), any({1, 2, 70, 3}), any({1, 2, 70, 2}), any({2, 5})}, [](V v) {
         static const auto tiles = tile_pattern(Window5(), 70, 70, 0, 0);
         return attend_blocks(mul_scalar(v[0], 2.0f), v[1], v[2], tiles, {}, true, 0.0f, nullptr, v[3]);
       }},
      // Heads 0, 1 through a window's tiles; heads 2, 3 every 3rd key back, their classes 11 = 3 * 3 + 2
      // rows long read in place from a transposed k; dropout.
      {"softmax_attention head groups: window 5 | period 3, T = 11, transposed k, dropout p=0.3",
       {any({1, 4, 11, 3}), transposed({1, 4, 11, 3}), any({1, 4, 11, 2})}, [](V v) {
         static const auto tiles = tile_pattern(Window5(), 11, 11, 0, 0);
         Rng rng(3);
         return attend_groups(mul_scalar(v[0], 2.0f), v[1], v[2], {{0, 2, tiles, 0}, {2, 4, nullptr, 3}}, {},
                                         0.3f, &rng);
       }},
      {"softmax_attention PositionMask: rows in another order, self mask; y and lse both used",
       {any({1, 2, 6, 3}), any({1, 2, 6, 3}), any({1, 2, 6, 2})}, [](V v) {
         const IndexTensor pos({1, 2, 6}, {3, 0, 5, 1, 4, 2, 0, 1, 2, 3, 4, 5});
         const std::vector<Var> r = attend_positioned(mul_scalar(v[0], 2.0f), v[1], v[2], nullptr, pos, pos, true);
         // exp: a fallback row's lse (-1e5) gives 0; the factor 0.1, not 0.5: e^(lse / 2) near e^10 would
         // drown the fixed step in float rounding.
         return add(sum(r[0]), sum(exp(mul_scalar(r[1], 0.1f))));
       },
       // Float rounding of L moves a step-1e-3 difference quotient by about 1e-3 here (it failed one
       // element by 3% of the tolerance); the quotients at 2e-3, 4e-3 and 8e-3 and a Richardson
       // extrapolation all agree with the analytic gradient within tolerance.
       4e-3},
      {"softmax_attention block mask, 6 queries after 64 cached keys, dropout p=0.3",
       {any({1, 1, 6, 3}), any({1, 1, 70, 3}), any({1, 1, 70, 3})}, [](V v) {
         static const auto tiles = tile_pattern(Window5(), 6, 70, 64, 0);
         Rng rng(3);
         return attend_blocks(mul_scalar(v[0], 2.0f), v[1], v[2], tiles, {}, true, 0.3f, &rng);
       }},
      {"gather_rows one permutation for every head, transposed x", {transposed({2, 3, 5, 4})},
       [](V v) { return gather_rows(v[0], ids({5}, {3, 0, 4, 1, 2})); }},
      {"gather_rows per-row index with repeats and fewer rows", {any({2, 2, 5, 3})},
       [](V v) { return gather_rows(v[0], ids({2, 2, 3}, {4, 4, 0, 1, 2, 3, 0, 0, 0, 2, 1, 4})); }},
      {"favor_attention (1, 2, 6, 3) log-features, v (.., 4), transposed b", {any({1, 2, 6, 3}), transposed({1, 2, 6, 3}), any({1, 2, 6, 4})},
       [](V v) { return favor_attention(v[0], v[1], v[2]); }},
      {"favor_attention, log-features around 20 (stabilisers at work)", {any({1, 1, 5, 3}), any({1, 1, 5, 3}), any({1, 1, 5, 2})},
       [](V v) { return favor_attention(add_scalar(mul_scalar(v[0], 4.0f), 20.0f), add_scalar(mul_scalar(v[1], 4.0f), 20.0f), v[2]); }},
      {"embedding repeated ids", {any({7, 5})}, [](V v) { return embedding(v[0], ids({3, 4}, {1, 6, 1, 0, 3, 3, 3, 2, 6, 5, 4, 1})); }},
      // ---- linear attention (positive features where the op needs them) ----
      {"causal_product (2,2,6,3) x (2,2,6,4), transposed a",
       {transposed({2, 2, 6, 3}), any({2, 2, 6, 3}), any({2, 2, 6, 4})},
       [](V v) { return causal_product(v[0], v[1], v[2]); }},
      {"linear_attention causal, sliced v", {pos({2, 2, 6, 3}), pos({2, 2, 6, 3}), sliced({2, 2, 6, 4})},
       [](V v) { return linear_attention(v[0], v[1], v[2], true); }},
      {"linear_attention non-causal", {pos({2, 2, 6, 3}), pos({2, 2, 6, 3}), any({2, 2, 6, 4})},
       [](V v) { return linear_attention(v[0], v[1], v[2], false); }},
      {"efficient_attention causal, transposed v", {any({2, 2, 6, 3}), any({2, 2, 6, 3}), transposed({2, 2, 6, 4})},
       [](V v) { return efficient_attention(mul_scalar(v[0], 2.0f), mul_scalar(v[1], 2.0f), v[2], true); }},
      {"efficient_attention non-causal", {any({2, 2, 6, 3}), sliced({2, 2, 6, 3}), any({2, 2, 6, 4})},
       [](V v) { return efficient_attention(mul_scalar(v[0], 2.0f), mul_scalar(v[1], 2.0f), v[2], false); }},
  };
  return rows;
}

}  // namespace

TEST_CASE("gradcheck: every op in the table") {
  Rng rng(2024);
  for (const Row& row : table()) {
    std::vector<Tensor> inputs;
    for (const In& in : row.inputs) inputs.push_back(make(in, rng));
    GradcheckOptions opt;
    opt.label = row.name;
    opt.eps = row.eps;
    const GradcheckResult r = gradcheck(row.f, inputs, opt);
    INFO(row.name);
    CHECK_MESSAGE(r.ok, r.message);
    CHECK(r.checked > 0);
  }
}

TEST_CASE("gradcheck can fail: a gradient 5% off, NaN or infinite, in any input of any row is caught") {
  for (const Row& row : table()) {
    for (size_t which = 0; which < row.inputs.size(); ++which) {
      for (Scalar k : {0.95f, 1.05f, std::numeric_limits<Scalar>::quiet_NaN(), std::numeric_limits<Scalar>::infinity()}) {
        Rng rng(2024);
        std::vector<Tensor> inputs;
        for (const In& in : row.inputs) inputs.push_back(make(in, rng));
        const GradcheckFn wrong = [&row, which, k](V v) {
          std::vector<Var> w = v;
          w[which] = scale_gradient(v[which], k);
          return row.f(w);
        };
        INFO(row.name, ", input ", which, ", gradient scaled by ", k);
        CHECK_FALSE(gradcheck(wrong, inputs).ok);
      }
    }
  }
}

TEST_CASE("extrapolate mode: every row passes, and a gradient 5% off in any input still fails") {
  GradcheckOptions opt;
  opt.extrapolate = true;
  for (const Row& row : table()) {
    Rng rng(2024);
    std::vector<Tensor> inputs;
    for (const In& in : row.inputs) inputs.push_back(make(in, rng));
    opt.label = row.name;
    const GradcheckResult r = gradcheck(row.f, inputs, opt);
    INFO(row.name);
    CHECK_MESSAGE(r.ok, r.message);
    for (size_t which = 0; which < row.inputs.size(); ++which) {
      for (Scalar k : {0.95f, 1.05f}) {
        const GradcheckFn wrong = [&row, which, k](V v) {
          std::vector<Var> w = v;
          w[which] = scale_gradient(v[which], k);
          return row.f(w);
        };
        INFO("input ", which, ", gradient scaled by ", k);
        CHECK_FALSE(gradcheck(wrong, inputs, opt).ok);
      }
    }
  }
}

TEST_CASE("a large scalar output: sum(x * x) over 1024 values near 10") {
  // L is near 1e5, where float32 resolves steps of about 0.008: the fixed
  // step's difference quotient is off by several units of the true 2x.
  Rng rng(7);
  std::vector<Scalar> v(1024);
  for (auto& x : v) x = 8.0f + 4.0f * rng.uniform();  // [8, 12)
  const Tensor x = Tensor::from({1024}, v);
  const GradcheckFn square_sum = [](V in) { return sum(mul(in[0], in[0])); };
  CHECK_FALSE(gradcheck(square_sum, {x.clone()}).ok);  // the false failure extrapolate mode exists for

  GradcheckOptions opt;
  opt.extrapolate = true;
  const GradcheckResult r = gradcheck(square_sum, {x.clone()}, opt);
  CHECK_MESSAGE(r.ok, r.message);
  CHECK(r.checked == 1024);
  CHECK(r.max_abs_error < 0.2);  // of derivatives near 20
  MESSAGE("sum(x * x), extrapolate: max |analytic - numeric| ", r.max_abs_error, ", float noise in L ", r.noise);
  for (Scalar k : {0.95f, 1.05f}) {
    const GradcheckFn wrong = [k](V in) {
      const Var y = scale_gradient(in[0], k);
      return sum(mul(y, y));
    };
    INFO("gradient scaled by ", k);
    CHECK_FALSE(gradcheck(wrong, {x.clone()}, opt).ok);
  }
}

TEST_CASE("gradcheck fails where the function overflows (an infinite numeric gradient is no pass)") {
  // exp(88.722) is finite in float, exp(88.723) is not: numeric = inf.
  const GradcheckResult r = gradcheck([](V v) { return exp(v[0]); }, {Tensor::full({1}, 88.722f)});
  CHECK_FALSE(r.ok);
  CHECK(std::isinf(r.max_abs_error));
}

TEST_CASE("detach stops the gradient (no finite-difference counterpart)") {
  // f(x) = x * detach(x): the tape must give df/dx = detach(x) = x, while the
  // true derivative 2x is what gradcheck sees numerically.
  Rng rng(5);
  Tensor xt = make(any({3, 4}), rng);
  Var x(xt, true);
  backward(sum(mul(x, detach(x))));
  const auto g = x.grad().to_vector(), xv = xt.to_vector();
  for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(xv[i]).epsilon(1e-6));
  const GradcheckResult r = gradcheck([](V v) { return mul(v[0], detach(v[0])); }, {xt.clone()});
  CHECK_FALSE(r.ok);
}

TEST_CASE("every op declared in autograd/ops.h has a gradcheck row") {
  std::ifstream in(std::string(TAPEFORMER_SOURCE_DIR) + "/autograd/ops.h");
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  std::set<std::string> declared;
  const std::regex decl(R"((?:^|\n)(?:Var|std::vector<Var>) ([a-z_0-9]+)\()");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), decl); it != std::sregex_iterator(); ++it)
    declared.insert((*it)[1]);
  REQUIRE(declared.size() > 30);
  std::set<std::string> covered{"detach"};  // checked by its own test above
  for (const Row& row : table()) covered.insert(row.name.substr(0, row.name.find(' ')));
  for (const std::string& op : declared) CHECK_MESSAGE(covered.count(op) == 1, "no gradcheck row for op '", op, "'");
}
