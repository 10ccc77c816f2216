#include <doctest/doctest.h>

#include <cmath>

#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/core/error.h"
#include "golden.h"
#include "tapeformer/layers/attention/softmax.h"
#include "tapeformer/layers/transformer.h"
#include "sampling_stats.h"
#include "scale_gradient.h"

using namespace tapeformer;

namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

IndexTensor random_ids(int64_t B, int64_t T, int32_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(B * T);
  for (auto& x : v) x = static_cast<int32_t>(rng.below(V));
  return IndexTensor({B, T}, v);
}

}  // namespace

TEST_CASE("Module: dotted names in registration order, tied weights listed once") {
  Rng rng(0);
  TransformerLM model(tiny_config(), rng);
  const auto params = model.named_parameters();
  REQUIRE(params.size() > 4);
  CHECK(params[0].first == "tok_emb.weight");
  CHECK(params[1].first == "pos_emb.weight");
  CHECK(params[2].first == "0.ln_1.weight");
  bool has_qkv = false;
  for (const auto& p : params) has_qkv = has_qkv || p.first == "1.attn.qkv.weight";
  CHECK(has_qkv);
  CHECK(params.back().first == "ln_f.bias");  // tied: no lm_head.weight
  // parameters: emb 11*8 + pos 8*8 + per block (2 LN 32 + qkv 8*24+24 + proj 72 + fc 8*32+32 + proj 32*8+8) + ln_f 16
  const int64_t per_block = 2 * 16 + (8 * 24 + 24) + (8 * 8 + 8) + (8 * 32 + 32) + (32 * 8 + 8);
  CHECK(model.num_parameters() == 11 * 8 + 8 * 8 + 2 * per_block + 16);
}

TEST_CASE("Module: GPT-2 init statistics") {
  ModelConfig c = tiny_config();
  c.n_embd = 64;
  c.n_head = 4;
  c.n_layer = 8;
  Rng rng(1);
  TransformerLM model(c, rng);
  auto stdev = [](const Tensor& t) {
    double s = 0, s2 = 0;
    for (Scalar v : t.to_vector()) s += v, s2 += double(v) * v;
    const double n = t.numel();
    return std::sqrt(s2 / n - (s / n) * (s / n));
  };
  const auto& blocks = std::dynamic_pointer_cast<StandardStack>(model.stack)->blocks;
  const Tensor& qkv = std::dynamic_pointer_cast<MultiHeadAttention>(blocks[0]->attn)->qkv->weight.value();
  const Tensor& proj = std::dynamic_pointer_cast<FeedForward>(blocks[0]->mlp)->proj->weight.value();  // residual projection: 0.02 / sqrt(2 * 8)
  CHECK(stdev_z(stdev(qkv), 0.02, qkv.numel()) < kZ);
  CHECK(stdev_z(stdev(proj), 0.02 / std::sqrt(16.0), proj.numel()) < kZ);
  CHECK(blocks[0]->ln_1->weight.value().to_vector() == std::vector<Scalar>(64, 1.0f));
}

TEST_CASE("Module: load_state round trip and errors name the key and shapes") {
  Rng rng(2), rng2(3);
  TransformerLM a(tiny_config(), rng), b(tiny_config(), rng2);
  b.load_state(a.state());
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(pa[i].second.value().to_vector() == pb[i].second.value().to_vector());

  NamedTensors st = a.state();
  st.pop_back();
  CHECK_THROWS_WITH_AS(b.load_state(st), doctest::Contains("missing key 'ln_f.bias'"), Error);
  st = a.state();
  st[0].second = Tensor::zeros({3, 8});
  CHECK_THROWS_WITH_AS(b.load_state(st), doctest::Contains("'tok_emb.weight' has shape [3, 8] but the model expects [11, 8]"),
                       Error);
  st = a.state();
  st.emplace_back("extra.weight", Tensor::zeros({2}));
  CHECK_THROWS_WITH_AS(b.load_state(st), doctest::Contains("unexpected key 'extra.weight'"), Error);
}

TEST_CASE("causality probe: changing token t leaves logits before t bitwise unchanged") {
  Rng rng(4);
  TransformerLM model(tiny_config(), rng);
  const IndexTensor ids = random_ids(2, 8, 11, 5);
  Rng r1(0), r2(0);
  NoGradGuard no_grad;
  const std::vector<Scalar> base = model.forward(ids, r1).value().to_vector();
  for (int64_t t = 0; t < 8; ++t) {
    IndexTensor changed = ids;
    changed.data[t] = (changed.data[t] + 1) % 11;  // batch row 0, position t
    const std::vector<Scalar> out = model.forward(changed, r2).value().to_vector();
    bool before_same = true, at_t_differs = false;
    for (int64_t s = 0; s < 8; ++s)
      for (int64_t v = 0; v < 11; ++v) {
        const size_t i = s * 11 + v;
        if (s < t) before_same = before_same && out[i] == base[i];
        if (s == t) at_t_differs = at_t_differs || out[i] != base[i];
      }
    CHECK_MESSAGE(before_same, "position ", t);
    CHECK(at_t_differs);
    // Batch row 1 is untouched entirely.
    for (size_t i = 8 * 11; i < base.size(); ++i) REQUIRE(out[i] == base[i]);
  }
}

TEST_CASE("sequences longer than the block size are rejected") {
  Rng rng(6);
  TransformerLM model(tiny_config(), rng);
  CHECK_THROWS_WITH_AS(model.forward(random_ids(1, 9, 11, 1), rng),
                       doctest::Contains("TransformerLM: sequence length 9 exceeds the 8 positions of model.positional \"learned\" (model.block_size); "
                       "a positional scheme without a table takes any length"), Error);
}

TEST_CASE("attention module gradchecks end to end (input and every parameter)") {
  Rng rng(7);
  MultiHeadAttention attn(6, 2, true, 0.0f, 0.3f, rng);
  // Larger weights than the 0.02 init so the softmax is far from uniform.
  for (auto& [name, p] : attn.named_parameters()) rng.fill_normal(p.value(), 0.0f, 0.5f);
  Tensor xt = Tensor::empty({2, 5, 6});
  rng.fill_normal(xt, 0, 1);
  Var x(xt, true);
  std::vector<Var> checked = attn.parameters();
  checked.push_back(x);
  const auto r = gradcheck_vars([&] { Rng r0(0); return attn.forward(x, r0); }, checked,
                                {1e-3, 1e-3, 1e-2, 0, "MultiHeadAttention"});
  CHECK_MESSAGE(r.ok, r.message);
  CHECK(r.checked == 2 * 5 * 6 + 6 * 18 + 18 + 6 * 6 + 6);
}

TEST_CASE("scaled_dot_product_attention matches a naive loop (mask placement; causal and not)") {
  for (bool causal : {true, false}) {
    CAPTURE(causal);
    Rng rng(8);
    const int64_t B = 1, H = 2, T = 4, D = 3;
    Tensor q = Tensor::empty({B, H, T, D}), k = Tensor::empty({B, H, T, D}), v = Tensor::empty({B, H, T, D});
    rng.fill_normal(q, 0, 1);
    rng.fill_normal(k, 0, 1);
    rng.fill_normal(v, 0, 1);
    Var out = scaled_dot_product_attention(Var(q), Var(k), Var(v), causal, 0.0f, nullptr);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t last = causal ? i : T - 1;  // the last key position query i sees
        std::vector<double> w(last + 1);
        double m = -1e30, z = 0;
        for (int64_t j = 0; j <= last; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += q.at({0, h, i, d}) * k.at({0, h, j, d});
          w[j] = s / std::sqrt(double(D));
          m = std::max(m, w[j]);
        }
        for (auto& x : w) z += (x = std::exp(x - m));
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= last; ++j) o += w[j] / z * v.at({0, h, j, d});
          CHECK(out.value().at({0, h, i, d}) == doctest::Approx(o).epsilon(1e-5));
        }
      }
  }
}

TEST_CASE("fused causal_attention equals the composition of primitives (values and gradients)") {
  // One query block with tiny heads; T = 37 (three 16-row query blocks and a
  // remainder) with heads of 16 (whole packets) and of 12 (partial packets
  // written into the interleaved qkv gradient).
  struct Case {
    int64_t B, T, H, D;
  };
  for (const Case& k : {Case{3, 7, 2, 4}, Case{2, 37, 2, 16}, Case{2, 37, 3, 12}}) {
    for (float p : {0.0f, 0.25f}) {
      CAPTURE(k.T);
      CAPTURE(p);
      const int64_t C = k.H * k.D;
      Rng rng(12);
      Tensor qkv_t = Tensor::empty({k.B, k.T, 3 * C});
      rng.fill_normal(qkv_t, 0, 1);
      Tensor upstream = Tensor::empty({k.B, k.T, C});
      rng.fill_normal(upstream, 0, 1);
      Var a(qkv_t.clone(), true), b(qkv_t.clone(), true), fused, composed;
      Rng ra(99), rb(99);  // same seed: same dropout masks
      {
        TapeScope tape;  // backward() runs a whole tape: one tape per computation
        fused = causal_attention(a, k.H, p, &ra);
        backward(fused, upstream);
      }
      {
        TapeScope tape;
        composed = composed_attention(b, k.H, true, p, &rb);
        backward(composed, upstream);
      }
      const auto fv = fused.value().to_vector(), cv = composed.value().to_vector();
      const auto fg = a.grad().to_vector(), cg = b.grad().to_vector();
      for (size_t i = 0; i < fv.size(); ++i) REQUIRE(fv[i] == doctest::Approx(cv[i]).epsilon(1e-5).scale(1));
      for (size_t i = 0; i < fg.size(); ++i) REQUIRE(fg[i] == doctest::Approx(cg[i]).epsilon(1e-5).scale(1));
    }
  }
}

TEST_CASE("fused feed_forward equals linear -> activation -> linear (values and gradients)") {
  // F = 20, N = 5: whole and partial packets in both epilogues; the second
  // shape runs several row tiles and 64-column blocks. `needs` picks which
  // inputs require grad (all, only x, only the parameters, only the second
  // layer's: then no derivative is kept).
  struct Case {
    int64_t B, T, C, F, N;
  };
  for (const Case& k : {Case{2, 7, 5, 20, 5}, Case{2, 37, 24, 136, 70}}) {
    for (Activation act : {Activation::Gelu, Activation::Relu}) {
      for (bool bias : {true, false}) {
        for (int needs = 0; needs < 4; ++needs) {
          CAPTURE(k.T);
          CAPTURE(static_cast<int>(act));
          CAPTURE(bias);
          CAPTURE(needs);
          Rng rng(21);
          auto random = [&](const Shape& s) {
            Tensor t = Tensor::empty(s);
            rng.fill_normal(t, 0, 1);
            return t;
          };
          const std::vector<Tensor> values = {random({k.B, k.T, k.C}), random({k.C, k.F}), random({k.F}),
                                              random({k.F, k.N}), random({k.N})};
          const Tensor upstream = random({k.B, k.T, k.N});
          auto inputs = [&] {
            std::vector<Var> v;
            for (size_t i = 0; i < values.size(); ++i)
              v.emplace_back(values[i].clone(), needs == 0 || (needs == 1 && i == 0) || (needs == 2 && i > 0) ||
                                                    (needs == 3 && i >= 3));
            if (!bias) v[2] = v[4] = Var();
            return v;
          };
          std::vector<Var> a = inputs(), b = inputs();
          Var fused, composed;
          {
            TapeScope tape;
            fused = feed_forward(a[0], a[1], a[2], a[3], a[4], act);
            backward(fused, upstream);
          }
          {
            TapeScope tape;
            Var h = linear(b[0], b[1], b[2]);
            h = act == Activation::Gelu ? gelu(h) : relu(h);
            composed = linear(h, b[3], b[4]);
            backward(composed, upstream);
          }
          const auto fv = fused.value().to_vector(), cv = composed.value().to_vector();
          for (size_t i = 0; i < fv.size(); ++i) REQUIRE(fv[i] == doctest::Approx(cv[i]).epsilon(1e-6).scale(1));
          {
            NoGradGuard no_grad;  // no derivative kept: the same forward
            const Var eval = feed_forward(a[0], a[1], a[2], a[3], a[4], act);
            CHECK_FALSE(eval.requires_grad());
            CHECK(eval.value().to_vector() == fv);
          }
          for (size_t i = 0; i < a.size(); ++i) {
            CAPTURE(i);
            REQUIRE(a[i].has_grad() == b[i].has_grad());
            if (!a[i].has_grad()) continue;
            const auto fg = a[i].grad().to_vector(), cg = b[i].grad().to_vector();
            for (size_t j = 0; j < fg.size(); ++j) REQUIRE(fg[j] == doctest::Approx(cg[j]).epsilon(1e-6).scale(1));
          }
        }
      }
    }
  }
}

TEST_CASE("TransformerLM gradchecks through every parameter (tied and untied head)") {
  for (bool tie : {true, false}) {
    ModelConfig c = tiny_config();
    c.n_layer = 2;
    c.n_embd = 4;
    c.vocab_size = 5;
    c.block_size = 3;
    c.tie_weights = tie;
    Rng rng(9);
    TransformerLM model(c, rng);
    for (auto& [name, p] : model.named_parameters()) rng.fill_normal(p.value(), 0.0f, 0.4f);
    const IndexTensor ids = random_ids(2, 3, 5, 10), targets = random_ids(2, 3, 5, 11);
    // The loss's gradients are small (largest entries 0.008 to 0.13 per
    // parameter tensor), so a wider step (less float32 rounding noise: max
    // error ~2e-5 here) and atol 1e-4: a 5% error in a tensor whose largest
    // gradient is 0.008 exceeds the tolerance by 2x. The check below shows a
    // 5% error over the whole backward is caught.
    const GradcheckOptions opt{1e-2, 1e-4, 1e-2, 0, tie ? "TransformerLM tied" : "TransformerLM untied"};
    const auto r = gradcheck_vars([&] { Rng r0(0); return cross_entropy(model.forward(ids, r0), targets); },
                                  model.parameters(), opt);
    CHECK_MESSAGE(r.ok, r.message);
    CHECK(r.checked == model.num_parameters());
    for (Scalar k : {0.95f, 1.05f}) {
      const auto wrong = gradcheck_vars(
          [&] { Rng r0(0); return scale_gradient(cross_entropy(model.forward(ids, r0), targets), k); },
          model.parameters(), opt);
      CHECK_FALSE(wrong.ok);
    }
  }
}

TEST_CASE("TransformerLM with an inference state (KV caches) equals the full forward, piece by piece") {
  for (bool tie : {true, false}) {
    CAPTURE(tie);
    ModelConfig c = tiny_config();
    c.tie_weights = tie;
    Rng rng(21);
    TransformerLM model(c, rng);
    for (auto& [name, p] : model.named_parameters()) rng.fill_normal(p.value(), 0.0f, 0.3f);  // distinct rows
    model.eval();
    NoGradGuard no_grad;
    const int64_t B = 2, T = c.block_size, V = c.vocab_size;
    const IndexTensor ids = random_ids(B, T, static_cast<int32_t>(V), 22);
    Rng unused(0);
    const Tensor full = model.forward(ids, unused).value();  // (B, T, V)
    const auto piece = [&](int64_t t0, int64_t t1) {
      std::vector<int32_t> v;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = t0; t < t1; ++t) v.push_back(ids.data[b * T + t]);
      return IndexTensor({B, t1 - t0}, v);
    };
    auto state = model.make_state(B);
    // Fed whole to a fresh state: the same kernels, so the same bits.
    CHECK(model.forward(ids, *state).value().to_vector() == full.to_vector());
    state->reset();
    for (int pass = 0; pass < 2; ++pass) {  // the second pass after reset() is a new sequence
      CAPTURE(pass);
      // A prompt of 3, then single tokens, then a piece of 2, then the last token.
      for (const auto& [t0, t1] : {std::pair<int64_t, int64_t>{0, 3}, {3, 4}, {4, 5}, {5, 7}, {7, 8}}) {
        const int64_t from = t0;  // CAPTURE's lambda cannot take a binding (C++17)
        CAPTURE(from);
        const Tensor got = model.forward(piece(t0, t1), *state).value();  // (B, t1 - t0, V)
        REQUIRE(got.shape() == Shape{B, t1 - t0, V});
        CHECK(state->length() == t1);
        check_close(got, full.slice(1, t0, t1), "positions " + std::to_string(t0) + " to " + std::to_string(t1));
      }
      CHECK_THROWS_WITH_AS(model.forward(piece(0, 1), *state),
                           "TransformerLM: 8 positions seen + 1 new exceed the 8 positions of model.positional "
                           "\"learned\" (reset the state and feed the last 8 tokens)",
                           Error);
      state->reset();
      CHECK(state->length() == 0);
    }
  }
}

TEST_CASE("inference states: wrong batch, foreign state, training mode and gradients are refused") {
  Rng rng(23);
  TransformerLM model(tiny_config(), rng);
  const IndexTensor one = random_ids(1, 1, 11, 24);
  {
    NoGradGuard no_grad;
    auto state = model.make_state(1);
    CHECK_THROWS_WITH_AS(model.forward(one, *state), doctest::Contains("is for inference (eval() and NoGradGuard)"),
                         Error);  // still in training mode
    model.eval();
    CHECK_THROWS_WITH_AS(model.forward(random_ids(2, 1, 11, 25), *state),
                         "TransformerLM: ids [2, 1] must be (1, T) with T >= 1 for this state", Error);
    KVCache foreign(1, 2, 4, 8);
    CHECK_THROWS_WITH_AS(model.forward(one, foreign),
                         "TransformerLM: got a KVCache as its inference state, not a TransformerLM state", Error);
    Rng rng2(26);
    TransformerLM other(tiny_config(), rng2);
    CHECK_THROWS_WITH_AS(other.forward(one, *state), "TransformerLM: this inference state was made by another model",
                         Error);
    CHECK(model.forward(one, *state).value().shape() == Shape{1, 1, 11});
    // A failure part way (block 1 left in training mode) resets the state
    // instead of leaving block 0's cache a position ahead.
    std::dynamic_pointer_cast<StandardStack>(model.stack)->blocks[1]->train();
    CHECK_THROWS_WITH_AS(model.forward(one, *state), doctest::Contains("is for inference"), Error);
    CHECK(state->length() == 0);
    model.eval();
    CHECK(model.forward(random_ids(1, 8, 11, 27), *state).value().shape() == Shape{1, 8, 11});
  }
  auto state = model.make_state(1);
  CHECK_THROWS_WITH_AS(model.forward(one, *state), doctest::Contains("is for inference (eval() and NoGradGuard)"),
                       Error);  // gradients on
}
