// Activation recompute (autograd/recompute.h): the gradients with it are the
// gradients without it, bit for bit, dropout draws included; gradcheck passes
// through it; nested use works; a draw that is not replayed is caught.
#include <doctest/doctest.h>

#include <memory>

#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/recompute.h"
#include "tapeformer/autograd/tape.h"

using namespace tapeformer;

namespace {

// A small residual block with parameters and dropout: x (B, T, C) -> (B, T, C).
struct Block {
  Var w1, w2, gamma, beta;  // (C, 4C), (4C, C), (C), (C)
  float p = 0.3f;
  explicit Block(Rng& rng, int64_t C = 6) {
    Tensor a = Tensor::empty({C, 4 * C}), b = Tensor::empty({4 * C, C}), g = Tensor::empty({C}), s = Tensor::empty({C});
    rng.fill_normal(a, 0.0f, 0.4f);
    rng.fill_normal(b, 0.0f, 0.4f);
    rng.fill_normal(g, 1.0f, 0.1f);
    rng.fill_normal(s, 0.0f, 0.1f);
    w1 = Var(a, true);
    w2 = Var(b, true);
    gamma = Var(g, true);
    beta = Var(s, true);
  }
  Var forward(const Var& x, Rng& rng) const {
    const Var h = dropout(gelu(matmul(layer_norm(x, gamma, beta), w1)), p, rng);
    return add(x, matmul(h, w2));
  }
  std::vector<Var> parameters() const { return {w1, w2, gamma, beta}; }
};

Tensor input(uint64_t seed) {
  Rng rng(seed);
  Tensor x = Tensor::empty({2, 5, 6});
  rng.fill_normal(x, 0.0f, 1.0f);
  return x;
}

// Every gradient (the input's, then each parameter's) after backward of the
// loss of two blocks, each through recompute or not; draws from Rng(seed).
std::vector<std::vector<float>> gradients(const std::shared_ptr<Block>& a, const std::shared_ptr<Block>& b,
                                          bool with_recompute, uint64_t seed, float* loss_out = nullptr) {
  for (const auto& blk : {a, b})
    for (Var p : blk->parameters()) p.zero_grad();
  Var x(input(7), true);
  Rng rng(seed);
  const auto run = [&](const std::shared_ptr<Block>& blk, const Var& h) {
    if (!with_recompute) return blk->forward(h, rng);
    return recompute([blk](const std::vector<Var>& in, Rng& r) { return std::vector<Var>{blk->forward(in[0], r)}; },
                     {h}, rng)[0];
  };
  const Var loss = mean(mul(run(b, run(a, x)), run(b, run(a, x))));
  if (loss_out) *loss_out = loss.item();
  backward(loss);
  std::vector<std::vector<float>> out{x.grad().to_vector()};
  for (const auto& blk : {a, b})
    for (const Var& p : blk->parameters()) out.push_back(p.grad().to_vector());
  return out;
}

}  // namespace

TEST_CASE("recompute: the gradients equal those without it, bit for bit, dropout draws replayed") {
  Rng init(1);
  const auto a = std::make_shared<Block>(init), b = std::make_shared<Block>(init);
  float plain_loss = 0, recomputed_loss = 0;
  const auto plain = gradients(a, b, false, 3, &plain_loss);
  const auto again = gradients(a, b, true, 3, &recomputed_loss);
  CHECK(plain_loss == recomputed_loss);
  REQUIRE(plain.size() == again.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK(plain[i] == again[i]);
  }
  // The probe can fail: another dropout stream gives other gradients.
  CHECK(gradients(a, b, true, 4) != plain);
}

TEST_CASE("recompute: a draw that does not come from the given Rng is not replayed, and shows") {
  // fn draws from an Rng it captured instead of the one recompute hands it:
  // the second run meets another mask, so its gradient is not the first
  // run's. This is the mistake the bit-for-bit test above would catch.
  Rng init(1);
  const Block blk(init);
  const auto grads = [&](bool captured) {
    for (Var p : blk.parameters()) p.zero_grad();
    Var x(input(7), true);
    Rng own(5), outer(5);
    const Var y = recompute([&blk, &outer, captured](const std::vector<Var>& in, Rng& r) {
                              return std::vector<Var>{blk.forward(in[0], captured ? outer : r)};
                            }, {x}, own)[0];
    backward(mean(mul(y, y)));
    return blk.w1.grad().to_vector();
  };
  const std::vector<float> replayed = grads(false), stale = grads(true);
  Var x(input(7), true);
  for (Var p : blk.parameters()) p.zero_grad();
  Rng plain(5);
  const Var y = blk.forward(x, plain);
  backward(mean(mul(y, y)));
  CHECK(replayed == blk.w1.grad().to_vector());
  CHECK(stale != blk.w1.grad().to_vector());
}

TEST_CASE("recompute: gradcheck passes through it, nested use, inputs without gradient") {
  Rng init(2);
  auto blk = std::make_shared<Block>(init);
  blk->p = 0;  // finite differences need the same function every call
  const Tensor constant = input(9);
  GradcheckOptions opt;
  opt.label = "recompute(block(recompute(block(x)) + c))";
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Var>& in) {
        Rng rng(0);
        const Var y = recompute(
            [blk](const std::vector<Var>& v, Rng& r) {
              const Var inner = recompute([blk](const std::vector<Var>& u, Rng& q) {
                                            return std::vector<Var>{blk->forward(u[0], q)};
                                          }, {v[0]}, r)[0];
              return std::vector<Var>{blk->forward(add(inner, v[1]), r)};
            },
            {in[0], Var(constant)}, rng)[0];
        return mean(mul(y, y));
      },
      {input(8)}, opt);
  CHECK_MESSAGE(r.ok, r.message);
  const GradcheckResult params = gradcheck_vars(
      [&] {
        Rng rng(0);
        const Var x(input(8));
        return mean(recompute([blk](const std::vector<Var>& v, Rng& q) { return std::vector<Var>{blk->forward(v[0], q)}; },
                              {x}, rng)[0]);
      },
      blk->parameters(), opt);
  CHECK_MESSAGE(params.ok, params.message);
}

TEST_CASE("recompute: nothing kept under NoGradGuard, recomputing() only in the second run") {
  Rng init(3);
  const auto blk = std::make_shared<Block>(init);
  int runs = 0, second_runs = 0, differentiated = 0;
  const RecomputeFn fn = [&](const std::vector<Var>& in, Rng& r) {
    ++runs;
    if (recomputing()) ++second_runs;
    if (records_gradient()) ++differentiated;  // a training forward's side effects: both runs of a taped call
    return std::vector<Var>{blk->forward(in[0], r)};
  };
  Rng rng(0);
  {
    NoGradGuard no_grad;
    const Var y = recompute(fn, {Var(input(1), true)}, rng)[0];
    CHECK_FALSE(y.requires_grad());
  }
  CHECK(runs == 1);
  CHECK(current_tape().empty());
  const Var y = recompute(fn, {Var(input(1), true)}, rng)[0];
  CHECK(current_tape().size() == 1);  // one entry: the block's own ops are not on the caller's tape
  CHECK(records_gradient());
  CHECK(!recomputing());
  backward(mean(y));
  CHECK(runs == 3);
  CHECK(second_runs == 1);
  CHECK(differentiated == 2);  // not the call under NoGradGuard
}
