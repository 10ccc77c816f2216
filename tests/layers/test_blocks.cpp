// Block kinds: the reversible stack against the same couplings run with
// stored activations (values, every gradient, the rebuilt inputs), dropout
// replay, chunked feed-forward, memory held, and the block registry's refusals.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/storage.h"
#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/layers/block/gtrxl.h"
#include "tapeformer/layers/block/reversible.h"
#include "tapeformer/layers/mlp.h"
#include "tapeformer/layers/transformer.h"
#include "tapeformer/optim/optimizer.h"

using namespace tapeformer;

namespace {

ModelConfig stack_config(const std::string& attention, const std::string& positional, int64_t layers,
                         int64_t ff_chunks = 1, float dropout = 0.1f) {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 16;
  c.n_layer = layers;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = dropout;
  c.attention = attention;
  c.positional = positional;
  c.block = "reversible";
  if (ff_chunks != 1) c.options["ff_chunks"] = ff_chunks;
  if (attention == "lsh") {  // chunks of 4 over 16 positions: where rows hash matters, so a replay must redraw it
    c.options["lsh_chunk"] = int64_t{4};
    c.options["lsh_buckets"] = int64_t{4};
  }
  return c;
}

Tensor random(const Shape& s, uint64_t seed) {
  Rng rng(seed);
  Tensor t = Tensor::empty(s);
  rng.fill_normal(t, 0.0f, 1.0f);
  return t;
}

// max |a - b| / max |b|: the error relative to the tensor's scale.
double relative_error(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<Scalar> x = a.to_vector(), y = b.to_vector();
  double err = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(x[i]) - y[i]));
    scale = std::max(scale, std::abs(static_cast<double>(y[i])));
  }
  return scale > 0 ? err / scale : err;
}

// The couplings written out with ordinary ops: every activation on the tape.
// Records each layer's inputs (X1, X2) in `inputs` when given.
Var stored_activations(const ReversibleStack& stack, const Var& x, Rng& rng,
                       std::vector<std::pair<Tensor, Tensor>>* inputs = nullptr) {
  Var x1 = x, x2 = x;
  for (const auto& block : stack.blocks) {
    if (inputs) inputs->push_back({x1.value(), x2.value()});
    const Var y1 = add(x1, block->attention_branch(x2, rng));
    x2 = stack.ff_coupling(*block, x2, y1, rng);
    x1 = y1;
  }
  return mul_scalar(add(x1, x2), 0.5f);
}

struct Run {
  Tensor y, dx;
  std::vector<Tensor> grads;
};

Run run(const ReversibleStack& stack, const Tensor& x_value, const Tensor& dy, uint64_t seed, bool reversible) {
  for (const Var& p : stack.parameters()) p.zero_grad();
  Var x(x_value, /*requires_grad=*/true);
  Rng rng(seed);
  const Var y = reversible ? stack.forward(x, rng) : stored_activations(stack, x, rng);
  backward(y, dy);
  Run r{y.value(), x.grad(), {}};
  for (const Var& p : stack.parameters()) r.grads.push_back(p.grad());
  return r;
}

}  // namespace

TEST_CASE("reversible stack: values, input and parameter gradients equal stored activations (8 blocks, dropout)") {
  // LSH in training draws its rotations from the step's Rng: the backward's replay rebuilds the same buckets.
  for (const auto& [attention, positional, chunks] :
       {std::tuple<std::string, std::string, int64_t>{"softmax", "learned", 1}, {"softmax", "rope", 3},
        {"linear", "rope", 1}, {"softmax", "shaw", 4}, {"lsh", "learned", 1}}) {
    CAPTURE(attention);
    CAPTURE(positional);
    CAPTURE(chunks);
    const ModelConfig c = stack_config(attention, positional, 8, chunks);
    Rng init(1);
    const auto pos = positional_kinds().get(c.positional).make(c, init);
    ReversibleStack stack(c, *pos, init);
    const Tensor x = random({2, 16, 16}, 2), dy = random({2, 16, 16}, 3);
    const Run rev = run(stack, x, dy, 7, true), ref = run(stack, x, dy, 7, false);
    CHECK(rev.y.to_vector() == ref.y.to_vector());  // the same ops on the same values
    CHECK(relative_error(rev.dx, ref.dx) < 1e-5);
    REQUIRE(rev.grads.size() == ref.grads.size());
    for (size_t i = 0; i < rev.grads.size(); ++i) {
      CAPTURE(stack.named_parameters()[i].first);
      REQUIRE(rev.grads[i].defined());
      CHECK(relative_error(rev.grads[i], ref.grads[i]) < 1e-5);
    }
  }
}

TEST_CASE("reversible stack: the backward rebuilds every layer's inputs to 1e-5 of the stored ones") {
  const ModelConfig c = stack_config("softmax", "learned", 8);
  Rng init(4);
  const auto pos = positional_kinds().get(c.positional).make(c, init);
  ReversibleStack stack(c, *pos, init);
  // Weights well past the init's, so that each layer changes its inputs.
  for (auto& [name, p] : stack.named_parameters()) init.fill_normal(p.value(), 0.0f, 0.2f);
  const Tensor x_value = random({2, 16, 16}, 5);
  std::vector<std::pair<Tensor, Tensor>> stored;
  {
    NoGradGuard no_grad;
    Rng rng(8);
    stored_activations(stack, Var(x_value), rng, &stored);
  }
  std::vector<std::pair<Tensor, Tensor>> rebuilt(8);
  std::vector<size_t> order;
  stack.on_rebuilt = [&](size_t l, const Tensor& x1, const Tensor& x2) {
    order.push_back(l);
    rebuilt[l] = {x1, x2};
  };
  Var x(x_value, true);
  Rng rng(8);
  backward(stack.forward(x, rng), random({2, 16, 16}, 6));
  CHECK(order == std::vector<size_t>{7, 6, 5, 4, 3, 2, 1, 0});
  for (size_t l = 0; l < 8; ++l) {
    CAPTURE(l);
    CHECK(relative_error(rebuilt[l].first, stored[l].first) < 1e-5);
    CHECK(relative_error(rebuilt[l].second, stored[l].second) < 1e-5);
  }
  // The check can fail: the first layer's inputs are the embeddings twice.
  CHECK(relative_error(rebuilt[0].first, stored[1].first) > 0.1);
}

TEST_CASE("reversible stack: the same seed gives the same dropout masks, another seed others") {
  const ModelConfig c = stack_config("softmax", "learned", 3, 1, 0.3f);
  Rng init(9);
  const auto pos = positional_kinds().get(c.positional).make(c, init);
  ReversibleStack stack(c, *pos, init);
  const Tensor x = random({2, 16, 16}, 10), dy = random({2, 16, 16}, 11);
  const Run a = run(stack, x, dy, 21, true), b = run(stack, x, dy, 21, true), other = run(stack, x, dy, 22, true);
  CHECK(a.y.to_vector() == b.y.to_vector());
  CHECK(a.dx.to_vector() == b.dx.to_vector());
  CHECK(a.y.to_vector() != other.y.to_vector());
  stack.eval();  // no dropout: the seed no longer matters
  CHECK(run(stack, x, dy, 21, true).y.to_vector() == run(stack, x, dy, 22, true).y.to_vector());
}

TEST_CASE("reversible stack: chunked feed-forward gives the unchunked outputs") {
  Rng init(12);
  const ModelConfig one = stack_config("softmax", "learned", 2, 1, 0.0f), five = stack_config("softmax", "learned", 2, 5, 0.0f);
  const auto pos = positional_kinds().get(one.positional).make(one, init);
  ReversibleStack a(one, *pos, init);
  Rng init2(12);
  const auto pos2 = positional_kinds().get(five.positional).make(five, init2);
  ReversibleStack b(five, *pos2, init2);
  CHECK(b.ff_chunks == 5);
  const Tensor x = random({2, 16, 16}, 13), dy = random({2, 16, 16}, 14);
  const Run ra = run(a, x, dy, 1, true), rb = run(b, x, dy, 1, true);
  CHECK(relative_error(rb.y, ra.y) < 1e-6);
  CHECK(relative_error(rb.dx, ra.dx) < 1e-5);
  for (size_t i = 0; i < ra.grads.size(); ++i) CHECK(relative_error(rb.grads[i], ra.grads[i]) < 1e-5);
}

TEST_CASE("reversible stack: activation memory does not grow with depth; the standard stack's does") {
  const auto peak = [](const std::string& block, int64_t layers) {
    ModelConfig c = stack_config("softmax", "rope", layers, 1, 0.0f);
    c.block = block;
    c.block_size = 128;
    Rng init(15);
    const auto pos = positional_kinds().get(c.positional).make(c, init);
    const auto stack = block_kinds().get(block).make(c, *pos, init);
    const Tensor x_value = random({4, 128, 16}, 16), dy = random({4, 128, 16}, 17);
    Rng rng(1);
    backward(stack->forward(Var(x_value, true), rng), dy);  // parameter gradients now exist
    Var x(x_value, true);
    Storage::reset_peak();
    const int64_t before = Storage::live_bytes();
    backward(stack->forward(x, rng), dy);
    return static_cast<double>(Storage::peak_bytes() - before);
  };
  const double rev2 = peak("reversible", 2), rev8 = peak("reversible", 8);
  const double std2 = peak("standard", 2), std8 = peak("standard", 8);
  CHECK(rev8 < 1.2 * rev2);
  CHECK(std8 > 2.5 * std2);  // 3.0 here: 4x the layers, the part that does not grow aside
  CHECK(rev8 < 0.5 * std8);
}

TEST_CASE("block kinds: parameters equal the standard stack's; unknown kinds and misplaced keys are refused") {
  ModelConfig c = stack_config("softmax", "learned", 3);
  c.block = "standard";
  Rng a(1), b(1);
  TransformerLM standard(c, a);
  c.block = "reversible";
  TransformerLM reversible(c, b);
  CHECK(standard.num_parameters() == reversible.num_parameters());
  CHECK(TransformerLM::footprint(c).parameters == static_cast<double>(reversible.num_parameters()));
  // The same names: a standard checkpoint loads into a reversible model.
  CHECK_NOTHROW(reversible.load_state(standard.state()));
  // Measured on the built models: one layer's activations at a time against three layers'.
  const double kept_reversible = activation_floats(reversible), kept_standard = activation_floats(standard);
  MESSAGE("activation floats per sequence: reversible ", kept_reversible, ", standard ", kept_standard);
  CHECK(kept_reversible < 0.6 * kept_standard);
  CHECK(standard.is_training());
  standard.eval();
  CHECK(activation_floats(standard) == kept_standard);  // its own dropout draws and mode
  CHECK(!standard.is_training());

  ModelConfig bad = c;
  bad.block = "highway";
  const std::string unknown = "model.block: unknown kind \"highway\" (known: " + block_kinds().names() + ")";
  CHECK(block_kinds().names().rfind("standard, reversible, post_ln, gtrxl", 0) == 0);
  CHECK_THROWS_WITH_AS(bad.validate_kinds(), unknown.c_str(), Error);
  bad = c;
  bad.options["ff_chunks"] = int64_t{0};
  CHECK_THROWS_WITH_AS(bad.validate_kinds(), "model.ff_chunks must be >= 1, got 0", Error);
  bad.block = "standard";
  bad.options["ff_chunks"] = int64_t{4};
  CHECK_THROWS_WITH_AS(bad.validate_kinds(),
                       "model.ff_chunks = 4 applies to model.block \"reversible\" only; this config selects "
                       "model.attention \"softmax\", model.positional \"learned\", model.block \"standard\" and model.mlp \"standard\"",
                       Error);
}

// ---- GTrXL -------------------------------------------------------------------

namespace {

ModelConfig gated_config(const std::string& gate, double bias, int64_t layers, int64_t width = 16) {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 16;
  c.n_layer = layers;
  c.n_head = 2;
  c.n_embd = width;
  c.block = "gtrxl";
  c.options["gate"] = gate;
  c.options["gate_bias"] = bias;
  return c;
}

double cosine(const Tensor& a, const Tensor& b) {
  const std::vector<Scalar> x = a.to_vector(), y = b.to_vector();
  double xy = 0, xx = 0, yy = 0;
  for (size_t i = 0; i < x.size(); ++i) xy += double(x[i]) * y[i], xx += double(x[i]) * x[i], yy += double(y[i]) * y[i];
  return xy / std::sqrt(xx * yy);
}

}  // namespace

TEST_CASE("gru_gate equals its composition from ops (values and gradients)") {
  const int64_t C = 6;
  const Tensor xv = random({2, 3, C}, 30), yv = random({2, 3, C}, 31), dg = random({2, 3, C}, 32);
  const Tensor wv = mul_scalar(Var(random({C, 3 * C}, 33)), 0.5f).value(), uv = mul_scalar(Var(random({C, 2 * C}, 34)), 0.5f).value();
  const Tensor ugv = mul_scalar(Var(random({C, C}, 35)), 0.5f).value(), bv = random({C}, 36);
  struct Out {
    Tensor g;
    std::vector<Tensor> grads;
  };
  const auto run_gate = [&](bool fused) {
    std::vector<Var> in = {Var(xv, true), Var(yv, true), Var(wv, true), Var(uv, true), Var(ugv, true), Var(bv, true)};
    const Var &x = in[0], &y = in[1], &w = in[2], &u = in[3], &ug = in[4], &b = in[5];
    Var g;
    if (fused) {
      g = gru_gate(x, y, w, u, ug, b);
    } else {
      const Var ay = matmul(y, w), ax = matmul(x, u);
      const Var r = sigmoid(add(slice(ay, -1, 0, C), slice(ax, -1, 0, C)));
      const Var z = sigmoid(sub(add(slice(ay, -1, C, 2 * C), slice(ax, -1, C, 2 * C)), b));
      const Var h = tanh(add(slice(ay, -1, 2 * C, 3 * C), matmul(mul(r, x), ug)));
      g = add(mul(add_scalar(neg(z), 1.0f), x), mul(z, h));
    }
    backward(g, dg);
    Out o{g.value(), {}};
    for (const Var& v : in) o.grads.push_back(v.grad());
    return o;
  };
  const Out fused = run_gate(true), composed = run_gate(false);
  CHECK(relative_error(fused.g, composed.g) < 1e-6);
  for (size_t i = 0; i < fused.grads.size(); ++i) {
    CAPTURE(i);
    CHECK(relative_error(fused.grads[i], composed.grads[i]) < 1e-5);
  }
}

TEST_CASE("gtrxl: at init with b_g = 2 a GRU-gated block's output is close to its input") {
  const ModelConfig c = gated_config("gru", 2.0, 1, 64);
  Rng init(40);
  const auto pos = positional_kinds().get(c.positional).make(c, init);
  GatedStack stack(c, *pos, init);
  const Tensor x = random({2, 16, 64}, 41);
  Rng rng(0);
  const double cos2 = cosine(stack.forward(Var(x), rng).value(), x);
  CHECK(cos2 > 0.9);
  // The check can fail: with b_g = -2 the gate mostly passes the branch.
  const ModelConfig open = gated_config("gru", -2.0, 1, 64);
  Rng init2(40);
  const auto pos2 = positional_kinds().get(open.positional).make(open, init2);
  GatedStack open_stack(open, *pos2, init2);
  CHECK(cosine(open_stack.forward(Var(x), rng).value(), x) < cos2);
}

TEST_CASE("every gate gradchecks in x, y and its parameters") {
  for (const GateKind& kind : gate_kinds().kinds()) {
    CAPTURE(kind.name);
    Rng rng(50);
    const std::shared_ptr<Gate> gate = kind.make(/*C=*/5, /*bias=*/1.0f, rng);
    std::vector<Var> vars;
    for (auto& [name, p] : gate->named_parameters()) {
      rng.fill_normal(p.value(), 0.0f, 0.5f);  // well past the init, so every term matters
      vars.push_back(p);
    }
    const Var x(random({2, 3, 5}, 51), true), y(random({2, 3, 5}, 52), true);
    vars.push_back(x);
    vars.push_back(y);
    const Tensor r = random({2, 3, 5}, 53);
    GradcheckOptions opt;
    opt.label = "gate " + kind.name;
    const GradcheckResult result = gradcheck_vars([&] { return sum(mul(gate->forward(x, y), Var(r))); }, vars, opt);
    CHECK_MESSAGE(result.ok, result.message);
  }
}

TEST_CASE("gtrxl: parameters per gate kind, and a bad gate is refused naming model.gate") {
  for (const GateKind& gate : gate_kinds().kinds()) {
    CAPTURE(gate.name);
    const ModelConfig c = gated_config(gate.name, 1.0, 2);
    Rng rng(60);
    CHECK(TransformerLM::footprint(c).parameters == static_cast<double>(TransformerLM(c, rng).num_parameters()));
  }
  CHECK(gate_kinds().get("gru").parameters(16) == 6 * 16 * 16 + 16);  // Parisotto et al. 2020 §3.2: 6 D^2 + D
  ModelConfig bad = gated_config("lstm", 2.0, 1);
  CHECK_THROWS_WITH_AS(bad.validate_kinds(),
                       "model.gate: unknown kind \"lstm\" (known: none, input, output, highway, sigtanh, gru)", Error);
  bad.block = "standard";
  bad.options.erase("gate_bias");
  CHECK_THROWS_WITH_AS(bad.validate_kinds(),
                       "model.gate = \"lstm\" applies to model.block \"gtrxl\" only; this config selects "
                       "model.attention \"softmax\", model.positional \"learned\", model.block \"standard\" and model.mlp \"standard\"",
                       Error);
}

TEST_CASE("activations: silu (fused) and a kind without a fused form equal their formula; a program registers one") {
  if (activation_kinds().find("squared_relu") == nullptr)
    activation_kinds().add({"squared_relu", "relu(x)^2", std::nullopt, [](const Var& x) {
                              const Var r = relu(x);
                              return mul(r, r);
                            }});
  for (const char* name : {"silu", "squared_relu"}) {
    CAPTURE(name);
    Rng rng(70);
    FeedForward ffn(8, 32, true, 0.0f, name, 0.02f, rng);
    for (auto& [n, p] : ffn.named_parameters()) rng.fill_normal(p.value(), 0.0f, 0.5f);
    const Tensor x = random({2, 3, 8}, 71);
    Rng unused(0);
    const Tensor got = ffn.forward(Var(x), unused).value();
    const Var h = add(matmul(Var(x), ffn.fc->weight), ffn.fc->bias);  // the formula, written out
    const Var a = std::string(name) == "silu" ? mul(h, sigmoid(h)) : mul(relu(h), relu(h));
    const Tensor want = add(matmul(a, ffn.proj->weight), ffn.proj->bias).value();
    CHECK(relative_error(got, want) < 1e-6);
  }
  // Built-in fused kinds still take the fused op; a whole model of a composed kind trains by name.
  CHECK(activation_kinds().get("gelu").fused == Activation::Gelu);
  CHECK(activation_kinds().get("silu").fused == Activation::Silu);
  ModelConfig c = stack_config("softmax", "learned", 2, 1, 0.0f);
  c.block = "standard";
  c.activation = "squared_relu";
  Rng rng(72);
  TransformerLM model(c, rng);
  CHECK(TransformerLM::footprint(c).parameters == static_cast<double>(model.num_parameters()));
  c.activation = "swish";
  CHECK_THROWS_WITH_AS(c.validate_kinds(), "model.activation: unknown kind \"swish\" (known: gelu, relu, silu, squared_relu)",
                       Error);
}

TEST_CASE("mlp kinds: gated MLPs equal their formula in values and gradients") {
  for (const char* kind : {"swiglu", "geglu"}) {
    CAPTURE(kind);
    ModelConfig c = stack_config("softmax", "learned", 2, 1, 0.0f);
    c.mlp = kind;
    Rng rng(80);
    const auto mlp = std::dynamic_pointer_cast<GatedFeedForward>(make_mlp(c, rng));
    REQUIRE(mlp != nullptr);
    CHECK(mlp->gate->weight.value().shape() == Shape{16, 48});  // 8 * 16 / 3 = 42.7, up to a multiple of 8
    for (auto& [n, p] : mlp->named_parameters()) rng.fill_normal(p.value(), 0.0f, 0.5f);
    const Tensor x = random({2, 3, 16}, 81), r = random({2, 3, 16}, 82);
    const auto run = [&](bool formula) {
      for (const Var& p : mlp->parameters()) p.zero_grad();
      Var xv(x.clone(), true);
      Rng unused(0);
      Var y;
      if (formula) {
        const Var g = add(matmul(xv, mlp->gate->weight), mlp->gate->bias);
        const Var act = std::string(kind) == "swiglu" ? mul(g, sigmoid(g)) : gelu(g);
        const Var h = mul(act, add(matmul(xv, mlp->up->weight), mlp->up->bias));
        y = add(matmul(h, mlp->proj->weight), mlp->proj->bias);
      } else {
        y = mlp->forward(xv, unused);
      }
      backward(sum(mul(y, Var(r))));
      std::vector<Tensor> out{y.value().clone(), xv.grad().clone()};
      for (const Var& p : mlp->parameters()) out.push_back(p.grad().clone());
      return out;
    };
    const std::vector<Tensor> got = run(false), want = run(true);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(relative_error(got[i], want[i]) < 1e-5);
  }
}

TEST_CASE("mlp kinds: parameter counts from the kinds, every block kind; mlp_hidden; misplaced keys refused") {
  for (const MlpKind& m : mlp_kinds().kinds()) {
    for (const BlockKind& block : block_kinds().kinds()) {
      CAPTURE(m.name);
      CAPTURE(block.name);
      ModelConfig c = stack_config("softmax", "learned", 2, 1, 0.0f);
      c.block = block.name;
      c.mlp = m.name;
      Rng rng(83);
      TransformerLM model(c, rng);
      CHECK(TransformerLM::footprint(c).parameters == static_cast<double>(model.num_parameters()));
      c.options["mlp_hidden"] = int64_t{24};
      TransformerLM wide(c, rng);
      CHECK(TransformerLM::footprint(c).parameters == static_cast<double>(wide.num_parameters()));
    }
  }
  ModelConfig c = stack_config("softmax", "learned", 2, 1, 0.0f);
  c.block = "standard";
  c.mlp = "swiglu";
  c.activation = "relu";
  CHECK_THROWS_WITH_AS(c.validate_kinds(),
                       "model.activation = \"relu\" does not apply to model.mlp \"swiglu\", whose activation is fixed",
                       Error);
  c.activation = "gelu";
  c.mlp = "swish_glu";
  CHECK_THROWS_WITH_AS(c.validate_kinds(), "model.mlp: unknown kind \"swish_glu\" (known: standard, swiglu, geglu)",
                       Error);
}

TEST_CASE("mlp kinds: a swiglu model learns a repeated sequence") {
  ModelConfig c = stack_config("softmax", "learned", 2, 1, 0.0f);
  c.block = "standard";
  c.mlp = "swiglu";
  Rng rng(84);
  TransformerLM model(c, rng);
  AdamW opt(decay_groups(model.named_parameters(), 1e-2f, 0.0f), 0.9f, 0.99f, 1e-8f);
  std::vector<int32_t> ids(2 * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7) % 11);
  const IndexTensor x({2, 16}, ids);
  std::vector<int32_t> next(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) next[i] = static_cast<int32_t>(((i + 1) * 7) % 11);
  const IndexTensor y({2, 16}, next);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    const Var loss = cross_entropy(model.forward(x, rng), y);
    (step == 0 ? first : last) = loss.value().item();
    backward(loss);
    opt.step();
    opt.zero_grad();
  }
  CHECK(first > 2.0);  // about ln 11 = 2.4 at the start
  CHECK(last < 0.5);
}
