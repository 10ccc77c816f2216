// Values rebuilt instead of kept (autograd/rebuild.h): LayerNorm's outputs
// released after the forward that made them are freed when only linear and
// feed_forward read them, and every gradient equals the one with them kept,
// bit for bit; any other reader gets them back with the same bits.
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/rebuild.h"
#include "tapeformer/autograd/tape.h"

using namespace tapeformer;

namespace {

Var normal(const Shape& shape, uint64_t seed, float mean_value, float sd, bool requires_grad = true) {
  Rng rng(seed);
  Tensor t = Tensor::empty(shape);
  rng.fill_normal(t, mean_value, sd);
  return Var(t, requires_grad);
}

// LayerNorm into a projection and into a fused MLP, C = 37 (packets and a
// tail), 3 x 17 rows.
struct Net {
  static constexpr int64_t C = 37;
  Var g1 = normal({C}, 1, 1.0f, 0.2f), b1 = normal({C}, 2, 0.0f, 0.2f);
  Var g2 = normal({C}, 3, 1.0f, 0.2f), b2 = normal({C}, 4, 0.0f, 0.2f);
  Var wq = normal({C, C}, 5, 0.0f, 0.2f), bq = normal({C}, 6, 0.0f, 0.1f);
  Var w1 = normal({C, 4 * C}, 7, 0.0f, 0.2f), c1 = normal({4 * C}, 8, 0.0f, 0.1f);
  Var w2 = normal({4 * C, C}, 9, 0.0f, 0.2f), c2 = normal({C}, 10, 0.0f, 0.1f);
  std::vector<Var> parameters() const { return {g1, b1, g2, b2, wq, bq, w1, c1, w2, c2}; }

  // x + linear(ln_1(x)), then + feed_forward(ln_2(.)): a pre-LN block, (B, T, C) -> (B, T, C).
  // `also` reads ln_2's output with an op that knows nothing of rebuilding.
  Var forward(const Var& x, bool also = false) const {
    const Var y = add(x, linear(layer_norm(x, g1, b1), wq, bq));
    const Var n = layer_norm(y, g2, b2);
    Var out = add(y, feed_forward(n, w1, c1, w2, c2, Activation::Gelu));
    if (also) out = add(out, mul(n, n));
    return out;
  }
};

// The input's and every parameter's gradient of sum(f(x)^2) through two
// blocks, each run through release_rebuildable or not.
std::vector<std::vector<float>> gradients(const Net& a, const Net& b, bool release, bool also) {
  for (const Net* net : {&a, &b})
    for (Var p : net->parameters()) p.zero_grad();
  Var x = normal({3, 17, Net::C}, 11, 0.5f, 2.0f);
  const auto run = [&](const Net& net, const Var& h) {
    return release ? release_rebuildable([&] { return net.forward(h, also); }) : net.forward(h, also);
  };
  const Var y = run(b, run(a, x));
  backward(sum(mul(y, y)));
  std::vector<std::vector<float>> out{x.grad().to_vector()};
  for (const Net* net : {&a, &b})
    for (const Var& p : net->parameters()) out.push_back(p.grad().to_vector());
  return out;
}

}  // namespace

TEST_CASE("rebuild: released LayerNorm outputs give the gradients of kept ones, bit for bit") {
  const Net a, b;
  for (bool also : {false, true}) {
    CAPTURE(also);
    const auto kept = gradients(a, b, false, also);
    const auto rebuilt = gradients(a, b, true, also);
    REQUIRE(kept.size() == rebuilt.size());
    for (size_t i = 0; i < kept.size(); ++i) {
      CAPTURE(i);
      CHECK(kept[i] == rebuilt[i]);
    }
  }
}

TEST_CASE("rebuild: an output only linear and feed_forward read is freed when the scope closes") {
  const Net net;
  Var x = normal({3, 17, Net::C}, 12, 0.0f, 1.0f);
  std::weak_ptr<Storage> ln_out;
  Var n;
  Tensor seen;  // n's value as the forward made it
  const Var y = release_rebuildable([&]() -> Var {
    n = layer_norm(x, net.g2, net.b2);
    ln_out = n.value().storage();
    seen = n.value().clone();
    return add(x, feed_forward(n, net.w1, net.c1, net.w2, net.c2, Activation::Gelu));
  });
  CHECK(ln_out.expired());  // nothing holds the buffer: feed_forward kept the Var, not its value
  CHECK(n.shape() == Shape{3, 17, Net::C});
  // Read again, it is rebuilt with the forward's bits and kept.
  CHECK(n.value().to_vector() == seen.to_vector());
  CHECK(n.value().defined());
  backward(sum(y));
  CHECK(net.w1.has_grad());
}

TEST_CASE("rebuild: a buffer something else holds stays; the result is never released") {
  const Net net;
  Var x = normal({2, 5, Net::C}, 13, 0.0f, 1.0f);
  std::weak_ptr<Storage> held_elsewhere, returned;
  Tensor held;
  Var n;
  const Var y = release_rebuildable([&] {
    n = layer_norm(x, net.g1, net.b1);
    held = n.value();  // as an op that saves its input's tensor does
    held_elsewhere = held.storage();
    const Var m = layer_norm(add(x, linear(n, net.wq, net.bq)), net.g2, net.b2);  // m is the result
    returned = m.value().storage();
    return m;
  });
  CHECK_FALSE(held_elsewhere.expired());
  CHECK(n.value().to_vector() == held.to_vector());
  CHECK_FALSE(returned.expired());
  CHECK(y.rebuildable());
  CHECK(y.value().shares_storage(Tensor::over(returned.lock(), y.shape())));
}

TEST_CASE("rebuild: nothing is marked outside a scope or without recording") {
  const Net net;
  Var x = normal({2, 5, Net::C}, 14, 0.0f, 1.0f);
  CHECK_FALSE(releasing());
  CHECK_FALSE(layer_norm(x, net.g1, net.b1).rebuildable());
  release_rebuildable([&] {
    CHECK(releasing());
    CHECK(layer_norm(x, net.g1, net.b1).rebuildable());
    NoGradGuard no_grad;
    CHECK_FALSE(releasing());
    const Var n = layer_norm(x, net.g1, net.b1);
    CHECK_FALSE(n.rebuildable());
    return n;
  });
}

TEST_CASE("rebuild: the rebuilt value does not move when the parameters change in place") {
  const Net net;
  Var x = normal({2, 5, Net::C}, 15, 0.0f, 1.0f);
  Var n;
  Tensor seen;
  release_rebuildable([&] {
    n = layer_norm(x, net.g1, net.b1);
    seen = n.value().clone();
    return linear(n, net.wq, net.bq);
  });
  Var g = net.g1;
  g.value().fill(3.0f);  // an optimizer step
  CHECK(n.value_once().to_vector() == seen.to_vector());
}
