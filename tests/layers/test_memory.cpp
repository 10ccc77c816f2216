// Transformer-XL: relative scores against a naive loop, attention with a
// memory against attention over the concatenation [memory; x], segment
// recurrence against one forward over the whole sequence, no gradient into
// the memory, and the memory's update.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "golden.h"
#include "tapeformer/layers/attention/softmax.h"
#include "tapeformer/layers/transformer.h"
#include "memory_models.h"

using namespace tapeformer;
using memory_models::group_of;
using memory_models::held;

namespace {

Tensor random(const Shape& s, uint64_t seed, float std = 1.0f) {
  Rng rng(seed);
  Tensor t = Tensor::empty(s);
  rng.fill_normal(t, 0.0f, std);
  return t;
}

ModelConfig xl_config(const std::string& positional, int64_t mem_len, const std::string& block = "standard") {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.positional = positional;
  c.block = block;
  if (mem_len > 0) c.options["mem_len"] = mem_len;
  return c;
}

IndexTensor ids_in(int64_t B, int64_t T, int32_t lo, int32_t hi, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(B * T));
  for (auto& x : v) x = lo + static_cast<int32_t>(rng.below(static_cast<uint64_t>(hi - lo)));
  return IndexTensor({B, T}, v);
}

IndexTensor join(const IndexTensor& a, const IndexTensor& b) {
  const int64_t B = a.shape[0], Ta = a.shape[1], Tb = b.shape[1];
  std::vector<int32_t> v;
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t t = 0; t < Ta; ++t) v.push_back(a.data[static_cast<size_t>(r * Ta + t)]);
    for (int64_t t = 0; t < Tb; ++t) v.push_back(b.data[static_cast<size_t>(r * Tb + t)]);
  }
  return IndexTensor({B, Ta + Tb}, v);
}

IndexTensor columns_of(const IndexTensor& ids, int64_t t0, int64_t t1) {
  const int64_t B = ids.shape[0], T = ids.shape[1];
  std::vector<int32_t> v;
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = t0; t < t1; ++t) v.push_back(ids.data[static_cast<size_t>(r * T + t)]);
  return IndexTensor({B, t1 - t0}, v);
}

void randomise(Module& m, uint64_t seed) {
  Rng rng(seed);
  for (auto& [name, p] : m.named_parameters()) rng.fill_normal(p.value(), 0.0f, 0.3f);
}

}  // namespace

TEST_CASE("txl: relative scores equal the naive (q + u) . k_j + (q + v) . W_kR R_{i-j} loop (clamped or not)") {
  for (const int64_t clamp : {int64_t{0}, int64_t{3}}) {
    CAPTURE(clamp);
    ModelConfig c = xl_config("txl", 4);
    if (clamp > 0) c.options["clamp_len"] = clamp;
    Rng rng(1);
    const auto pos = positional_kinds().get("txl").make(c, rng);
    randomise(*pos, 2);
    const auto layer = pos->make_layer(rng);
    randomise(*layer, 3);
    const int64_t B = 2, H = 2, D = 8, C = 16, Tq = 3, Tk = 7, q0 = 4, k0 = 0;  // 4 memory rows, then 3
    const Tensor q = random({B, H, Tq, D}, 4), k = random({B, H, Tk, D}, 5);
    const Tensor got = layer->score_terms(Var(q), Var(k), q0, k0).value();  // (B, H, Tq, Tk)
    REQUIRE(got.shape() == Shape({B, H, Tq, Tk}));
    const auto named = [](const Module& m, const std::string& key) {
      for (const auto& [name, p] : m.named_parameters())
        if (name == key) return p.value();
      FAIL("no parameter " << key);
      return Tensor();
    };
    const Tensor u = named(*pos, "u"), v = named(*pos, "v"), w = named(*layer, "r_net");  // (H, D), (H, D), (C, C)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Tq; ++i)
          for (int64_t j = 0; j < Tk; ++j) {
            int64_t d = (q0 + i) - (k0 + j);
            if (d < 0) continue;  // the future: masked by the attention
            if (clamp > 0) d = std::min(d, clamp);
            std::vector<double> r(static_cast<size_t>(C));  // R_d = [sin(d w_k); cos(d w_k)]
            for (int64_t kk = 0; kk < C / 2; ++kk) {
              const double angle = static_cast<double>(d) * std::pow(10000.0, -2.0 * kk / C);
              r[static_cast<size_t>(kk)] = std::sin(angle);
              r[static_cast<size_t>(C / 2 + kk)] = std::cos(angle);
            }
            double want = 0;
            for (int64_t e = 0; e < D; ++e) {
              double rk = 0;  // (R_d W_kR) at head h, component e
              for (int64_t cc = 0; cc < C; ++cc) rk += r[static_cast<size_t>(cc)] * w.at({cc, h * D + e});
              want += u.at({h, e}) * k.at({b, h, j, e}) + (q.at({b, h, i, e}) + v.at({h, e})) * rk;
            }
            CHECK(got.at({b, h, i, j}) == doctest::Approx(want).epsilon(1e-5));
          }
  }
}

TEST_CASE("txl same_length: each query sees exactly the mem_len + 1 most recent positions") {
  ModelConfig c = xl_config("txl", 4);
  c.options["same_length"] = true;
  Rng rng(23);
  const auto pos = positional_kinds().get("txl").make(c, rng);
  const auto layer = pos->make_layer(rng);
  const std::vector<Tensor> bias = layer->score_bias(2, /*Tq=*/3, /*Tk=*/7, /*q0=*/4, /*k0=*/0);  // 4 memory rows
  REQUIRE(bias.size() == 1);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 7; ++j) {
      const int64_t d = 4 + i - j;  // distance; d < 0 is the future, masked by the attention anyway
      CAPTURE(i);
      CAPTURE(j);
      CHECK(bias[0].at({0, 0, i, j}) == (d > 4 ? -INFINITY : 0.0f));
    }
  c.options.erase("same_length");  // off: no bias at all
  Rng rng2(23);
  CHECK(positional_kinds().get("txl").make(c, rng2)->make_layer(rng2)->score_bias(2, 3, 7, 4, 0).empty());
}

TEST_CASE("attention with a memory equals attention over [memory; x], the memory rows' outputs dropped") {
  for (const char* scheme : {"txl", "rope", "alibi", "shaw", "learned"}) {
    CAPTURE(scheme);
    const ModelConfig c = xl_config(scheme, 5);
    Rng rng(6);
    const auto pos = positional_kinds().get(scheme).make(c, rng);
    const auto attn = attention_kinds().get("softmax").make(c, pos->make_layer(rng), rng);
    randomise(*pos, 7);
    randomise(*attn, 8);
    attn->eval();
    const Tensor mem = random({2, 5, 16}, 9), x = random({2, 3, 16}, 10);
    Rng unused(0);
    const Tensor with_memory = attn->forward(Var(x), Var(mem), unused).value();  // (2, 3, 16)
    const Tensor whole = attn->forward(concat({Var(mem), Var(x)}, 1), unused).value();  // (2, 8, 16)
    check_close(with_memory, whole.slice(1, 5, 8), scheme, 1e-5);
  }
}

TEST_CASE("segment recurrence: the second segment with the first as memory equals one forward over both") {
  for (const std::string& block : memory_models::memory_blocks())
    for (const char* scheme : {"txl", "rope"}) {
      CAPTURE(block);
      CAPTURE(scheme);
      const ModelConfig c = xl_config(scheme, 8, block);
      Rng rng(11);
      TransformerLM model(c, rng);
      randomise(model, 12);
      model.eval();
      const IndexTensor a = ids_in(2, 8, 0, 11, 13), b = ids_in(2, 8, 0, 11, 14);
      Rng unused(0);
      SegmentMemory memory;
      const Tensor first = model.forward(a, memory, unused).value();
      CHECK(held(memory, "layers") == 8);
      const Tensor second = model.forward(b, memory, unused).value();  // (2, 8, V)
      const Tensor whole = model.forward(join(a, b), unused).value();  // (2, 16, V)
      check_close(first, whole.slice(1, 0, 8), "first segment", 1e-5);
      check_close(second, whole.slice(1, 8, 16), "second segment", 1e-5);
    }
}

TEST_CASE("no gradient reaches the memory; the same tokens in one sequence do get one") {
  ModelConfig c = xl_config("txl", 8);
  c.tie_weights = false;  // else every row of the embedding gets the output layer's gradient
  Rng rng(15);
  TransformerLM model(c, rng);
  const IndexTensor a = ids_in(2, 8, 0, 5, 16), b = ids_in(2, 8, 5, 11, 17);  // disjoint vocabularies
  const IndexTensor targets = ids_in(2, 8, 0, 11, 18);
  Rng unused(0);
  const auto emb_grad_rows_0_to_4 = [&] {
    double s = 0;
    const Tensor g = model.tok_emb->weight.grad();
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t e = 0; e < 16; ++e) s += std::abs(g.at({r, e}));
    return s;
  };
  SegmentMemory memory;
  {
    NoGradGuard no_grad;
    model.forward(a, memory, unused);
  }
  for (const Var& p : model.parameters()) p.zero_grad();
  backward(cross_entropy(model.forward(b, memory, unused), targets));
  CHECK(emb_grad_rows_0_to_4() == 0.0);  // tokens 0..4 sit in the memory only
  // The check can fail: attending to those tokens as part of the input does carry a gradient to them.
  for (const Var& p : model.parameters()) p.zero_grad();
  backward(cross_entropy(slice(model.forward(join(a, b), unused), 1, 8, 16), targets));
  CHECK(emb_grad_rows_0_to_4() > 0.0);
}

TEST_CASE("the memory keeps each layer's inputs at the last mem_len positions") {
  const Tensor old = random({2, 3, 4}, 19), x = random({2, 5, 4}, 20);
  const Tensor kept = next_memory(old, Var(x), 6);  // [old; x] has 8 rows: the last 6 are old's last 1 and x
  REQUIRE(kept.shape() == Shape({2, 6, 4}));
  CHECK(kept.slice(1, 0, 1).to_vector() == old.slice(1, 2, 3).contiguous().to_vector());
  CHECK(kept.slice(1, 1, 6).to_vector() == x.to_vector());
  CHECK(next_memory(Tensor(), Var(x), 2).to_vector() == x.slice(1, 3, 5).contiguous().to_vector());
  CHECK(next_memory(Tensor(), Var(x), 9).shape() == Shape({2, 5, 4}));
}

TEST_CASE("ext_len: the last ext_len positions of an input stay out of the memory (they are fed again)") {
  ModelConfig c = xl_config("txl", 8);
  c.options["ext_len"] = int64_t{3};
  Rng rng(21);
  TransformerLM model(c, rng);
  model.eval();
  NoGradGuard no_grad;
  Rng unused(0);
  SegmentMemory with_ext;
  model.forward(ids_in(2, 8, 0, 11, 22), with_ext, unused);
  CHECK(held(with_ext, "layers") == 5);  // 8 positions read, the last 3 left for the next input
  // The same as a model without ext_len reading only the first 5 positions.
  ModelConfig plain = xl_config("txl", 8);
  Rng rng2(21);
  TransformerLM reference(plain, rng2);
  reference.eval();
  SegmentMemory without;
  reference.forward(columns_of(ids_in(2, 8, 0, 11, 22), 0, 5), without, unused);
  for (size_t l = 0; l < group_of(with_ext, "layers").size(); ++l)
    CHECK(group_of(with_ext, "layers")[l].to_vector() == group_of(without, "layers")[l].to_vector());
}

TEST_CASE("memory configs: kinds without one are refused naming the keys") {
  ModelConfig c = xl_config("txl", 8);
  c.attention = "linear";
  c.positional = "rope";
  CHECK_THROWS_WITH_AS(c.validate_kinds(),
                       "model.mem_len = 8 needs an attention kind that takes a segment memory; model.attention "
                       "\"linear\" does not",
                       Error);
  c = xl_config("txl", 8, "reversible");
  CHECK_THROWS_WITH_AS(c.validate_kinds(), doctest::Contains("model.mem_len = 8 applies to memory \"xl\" (of model.block \"standard\""),
                       Error);
  c = xl_config("txl", 0);
  c.options["same_length"] = true;
  CHECK_THROWS_WITH_AS(c.validate_kinds(), "model.same_length needs a memory: set model.mem_len > 0", Error);
  c = xl_config("txl", 0);
  c.options["ext_len"] = int64_t{2};
  CHECK_THROWS_WITH_AS(c.validate_kinds(), "model.ext_len = 2 needs a memory: set model.mem_len > 0", Error);
  c = xl_config("txl", 8);
  c.options["ext_len"] = int64_t{9};
  CHECK_THROWS_WITH_AS(c.validate_kinds(), "model.ext_len must be in [0, model.block_size = 8], got 9", Error);
  c = xl_config("txl", -1);
  c.options["mem_len"] = int64_t{-1};
  CHECK_THROWS_WITH_AS(c.validate_kinds(), "model.mem_len must be in [0, 2^20], got -1", Error);
}
