// Every guarded path throws tapeformer::Error whose message names the
// operation and the offending shapes or values.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "tapeformer/autograd/function.h"
#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "expect_error.h"

using namespace tapeformer;

namespace {

Var var(const Shape& s, bool grad = true) { return Var(Tensor::ones(s), grad); }
IndexTensor ids(const Shape& s, std::vector<int32_t> v) { return IndexTensor(s, std::move(v)); }

}  // namespace

TEST_CASE("core: shapes, tensors, views") {
  expect_error([] { Shape s{2, 3}; (void)s[2]; }, {"Shape", "index 2", "[2, 3]"});
  expect_error([] { Shape s{1, 2, 3, 4, 5, 6, 7}; }, {"rank 7", "maximum rank 6"});
  expect_error([] { Tensor::from({2, 2}, {1, 2, 3}); }, {"Tensor::from", "3 values", "[2, 2]"});
  expect_error([] { Tensor::ones({2, 3}).reshape({4, 2}); }, {"reshape", "[2, 3]", "[4, 2]"});
  expect_error([] { Tensor::ones({2, 3}).reshape({-1, -1}); }, {"reshape", "more than one -1"});
  expect_error([] { Tensor::ones({2, 3}).transpose(0, 2); }, {"transpose", "axis 2", "[2, 3]"});
  expect_error([] { Tensor::ones({2, 3}).permute({0, 0}); }, {"permute", "repeated", "[2, 3]"});
  expect_error([] { Tensor::ones({2, 3}).permute({0}); }, {"permute", "1 axes", "[2, 3]"});
  expect_error([] { Tensor::ones({2, 3}).slice(1, 2, 5); }, {"slice", "[2, 5)", "[2, 3]"});
  expect_error([] { Tensor::ones({2, 3}).squeeze(0); }, {"squeeze", "[2, 3]"});
  expect_error([] { Tensor::ones({2, 3}).unsqueeze(4); }, {"unsqueeze", "axis 4", "[2, 3]"});
  expect_error([] { Tensor::ones({2, 3}).expand({4, 3, 3}); }, {"expand", "[2, 3]", "[4, 3, 3]"});
  expect_error([] { (void)Tensor::ones({2, 3}).item(); }, {"item", "[2, 3]", "6 elements"});
  expect_error([] { Tensor::ones({2, 3}).at({0, 3}); }, {"at", "index 3", "[2, 3]"});
  expect_error([] { Tensor t; t.contiguous(); }, {"contiguous", "undefined"});
  expect_error([] { IndexTensor({2, 2}, {1, 2, 3}); }, {"IndexTensor", "3 values", "[2, 2]"});
}

TEST_CASE("core: threads and RNG") {
  expect_error([] { parallel::set_num_threads(-1); }, {"set_num_threads", "-1"});
  expect_error([] { Rng r(1); Tensor t = Tensor::empty({3}); r.fill_bernoulli(t, 1.5f); }, {"fill_bernoulli", "1.5"});
  expect_error([] { Rng r(1); Tensor t = Tensor::empty({3}); r.fill_normal(t, 0, -1); }, {"fill_normal", "-1"});
  expect_error([] { Rng r(1); (void)r.below(0); }, {"below"});
}

TEST_CASE("elementwise: non-broadcastable shapes are named, never silently broadcast") {
  for (auto op : std::vector<std::pair<const char*, std::function<Var(const Var&, const Var&)>>>{
           {"add", [](const Var& a, const Var& b) { return add(a, b); }},
           {"sub", [](const Var& a, const Var& b) { return sub(a, b); }},
           {"mul", [](const Var& a, const Var& b) { return mul(a, b); }},
           {"div", [](const Var& a, const Var& b) { return div(a, b); }}}) {
    expect_error([&] { op.second(var({3, 4}), var({3, 5})); }, {op.first, "[3, 4]", "[3, 5]", "do not broadcast"});
  }
  expect_error([] { where(Tensor::ones({2, 4}), var({3, 4}), var({3, 4})); }, {"where", "[2, 4]", "[3, 4]"});
  expect_error([] { masked_fill(var({3}), Tensor::ones({2, 3}), 0); }, {"masked_fill", "[2, 3]", "[3]"});
  expect_error([] { Rng r(1); dropout(var({3}), 1.0f, r); }, {"dropout", "1", "[0, 1)"});
  expect_error([] { expand(var({2, 3}), {4, 3}); }, {"expand", "[2, 3]", "[4, 3]"});
  expect_error([] { sum_to(var({2, 3}), {4}); }, {"sum_to", "[4]", "[2, 3]"});
}

TEST_CASE("reductions: bad and repeated axes") {
  expect_error([] { sum(var({2, 3}), {2}); }, {"sum", "axis 2", "[2, 3]"});
  expect_error([] { sum(var({2, 3}), {1, -1}); }, {"sum", "repeated axis", "[2, 3]"});
  expect_error([] { mean(var({2, 3}), {-3}); }, {"mean", "axis -3", "[2, 3]"});
  expect_error([] { max(var({2, 3}), 5); }, {"max", "axis 5", "[2, 3]"});
  expect_error([] { max(var({2, 0}), 1); }, {"max", "empty axis", "[2, 0]"});
  expect_error([] { cumsum(var({2, 3}), 2); }, {"cumsum", "axis 2", "[2, 3]"});
}

TEST_CASE("shape ops: concat, split, reshape, permute") {
  expect_error([] { concat({}, 0); }, {"concat", "no inputs"});
  expect_error([] { concat({var({2, 3}), var({3, 4})}, 0); }, {"concat", "input 1", "[3, 4]", "[2, 3]"});
  expect_error([] { split(var({2, 5}), {2, 2}, 1); }, {"split", "sum to 4", "[2, 5]", "5"});
  expect_error([] { reshape(var({2, 3}), {7}); }, {"reshape", "[2, 3]", "[7]"});
  expect_error([] { slice(var({2, 3}), 0, 1, 4); }, {"slice", "[2, 3]"});
}

TEST_CASE("matmul and linear: inner dims and ranks") {
  expect_error([] { matmul(var({4, 8}), var({7, 3})); }, {"matmul: inner dims differ: [4, 8] x [7, 3]"});
  expect_error([] { matmul(var({4}), var({4, 3})); }, {"matmul", "rank 2 to 4", "[4]"});
  expect_error([] { matmul(var({1, 1, 1, 2, 3}), var({3, 2})); }, {"matmul", "rank 2 to 4", "[1, 1, 1, 2, 3]"});
  expect_error([] { matmul(var({2, 3, 4}), var({5, 4, 6})); }, {"matmul", "[2]", "[5]"});
  expect_error([] { linear(var({2, 5}), var({4, 6}), Var()); }, {"linear", "[2, 5]", "[4, 6]"});
  expect_error([] { linear(var({2, 4}), var({4, 6}), var({5})); }, {"linear", "bias", "[5]", "[6]"});
  expect_error([] { linear(var({2, 4}), var({4}), Var()); }, {"linear", "weight", "[4]"});
}

TEST_CASE("nn ops: norms, softmax, cross_entropy, embedding, attention") {
  expect_error([] { softmax(Var(Tensor::scalar(1), true)); }, {"softmax", "rank >= 1", "[]"});
  expect_error([] { layer_norm(var({2, 5}), var({4}), Var()); }, {"layer_norm", "weight", "[4]", "[5]", "[2, 5]"});
  expect_error([] { layer_norm(var({2, 5}), Var(), var({6})); }, {"layer_norm", "bias", "[6]", "[5]"});
  expect_error([] { layer_norm(var({2, 5}), Var(), Var(), 0.0f); }, {"layer_norm", "eps", "0"});
  expect_error([] { rms_norm(var({2, 5}), var({3})); }, {"rms_norm", "weight", "[3]", "[2, 5]"});
  expect_error([] { rms_norm(var({2, 5}), Var(), -1.0f); }, {"rms_norm", "eps", "-1"});
  expect_error([] { cross_entropy(var({2, 3, 7}), ids({3, 2}, {0, 1, 2, 3, 4, 5})); },
               {"cross_entropy", "targets shape [3, 2]", "[2, 3, 7]", "[2, 3]"});
  expect_error([] { cross_entropy(var({2, 7}), ids({2}, {3, 7})); }, {"cross_entropy", "target 7", "7 classes", "[2, 7]"});
  expect_error([] { cross_entropy(var({2, 7}), ids({2}, {-2, 1})); }, {"cross_entropy", "target -2"});
  expect_error([] { embedding(var({5, 4}), ids({2}, {1, 5})); }, {"embedding", "index 5", "vocabulary of 5", "[5, 4]"});
  expect_error([] { embedding(var({5, 4}), ids({1}, {-1})); }, {"embedding", "index -1"});
  expect_error([] { embedding(var({5}), ids({1}, {0})); }, {"embedding", "[V, C]", "[5]"});
  expect_error([] { causal_attention(var({2, 3, 10}), 2); }, {"causal_attention", "(B, T, 3C)", "[2, 3, 10]"});
  expect_error([] { causal_attention(var({2, 3, 12}), 3); }, {"causal_attention", "width 4", "n_head 3"});
  expect_error([] { causal_attention(var({2, 3, 12}), 2, 0.5f, nullptr); }, {"causal_attention", "Rng"});
}

TEST_CASE("tape: backward without a seed, seed shapes, nothing to differentiate") {
  expect_error([] { backward(mul_scalar(var({2, 3}), 2)); }, {"backward", "one element", "[2, 3]", "seed"});
  expect_error([] { backward(mul_scalar(var({2, 3}), 2), Tensor::ones({3, 2})); }, {"backward", "[3, 2]", "[2, 3]"});
  expect_error([] { backward(sum(var({2}, false))); }, {"backward", "no output requires grad"});
  current_tape().clear();
  expect_error([] { accumulate_grad(var({2, 3}), Tensor::ones({3, 2}), "myop"); },
               {"myop", "gradient of shape [3, 2]", "input of shape [2, 3]"});
}

namespace {
struct WrongCount : Function {
  const char* name() const override { return "wrong_count"; }
  std::vector<Tensor> forward(FunctionContext&, const std::vector<Tensor>& in) override { return {in[0].clone()}; }
  std::vector<Tensor> backward(FunctionContext&, const std::vector<Tensor>& d) override { return {d[0], d[0]}; }
};
struct WrongShape : Function {
  const char* name() const override { return "wrong_shape"; }
  std::vector<Tensor> forward(FunctionContext&, const std::vector<Tensor>& in) override { return {in[0].clone()}; }
  std::vector<Tensor> backward(FunctionContext&, const std::vector<Tensor>& d) override {
    return {Tensor::ones({d[0].numel()})};
  }
};
}  // namespace

TEST_CASE("Function: wrong gradient count or shape names the Function") {
  expect_error([] { backward(sum(Function::apply<WrongCount>({var({2, 3})})[0])); },
               {"wrong_count", "2 gradients for 1 inputs"});
  expect_error([] { backward(sum(Function::apply<WrongShape>({var({2, 3})})[0])); },
               {"wrong_shape", "gradient of shape [6]", "input of shape [2, 3]"});
  current_tape().clear();
}

TEST_CASE("gradcheck: a function that ignores its inputs is refused") {
  expect_error([] { gradcheck([](const std::vector<Var>&) { return Var(Tensor::ones({2}), false); }, {Tensor::ones({2})}, "const"); },
               {"gradcheck(const)", "does not depend on any input"});
}
