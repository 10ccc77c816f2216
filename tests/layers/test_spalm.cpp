// SPALM's output (layers/spalm.h): spalm_mix against a brute-force loop,
// its gradient against finite differences, the limit case (gate closed:
// the Transformer-XL's logits bit for bit over several segments), missing
// neighbours, the checkpoint keys and the refusals.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "expect_error.h"
#include "memory_models.h"
#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/layers/spalm.h"

using namespace tapeformer;
using memory_models::normal;
using memory_models::segment;

namespace {

ModelConfig spalm_config(int64_t k) {
  ModelConfig c = memory_models::tiny_config(4);
  c.arch = "spalm";
  c.options["spalm_k"] = k;
  return c;
}

// (B, T, K) ids over the vocabulary of 11, with -1 where `missing` says.
IndexTensor retrieved_ids(int64_t B, int64_t T, int64_t K, uint64_t seed, double missing = 0) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(B * T * K));
  for (auto& x : v) x = rng.uniform() < missing ? -1 : static_cast<int32_t>(rng.below(11));
  return IndexTensor({B, T, K}, v);
}

// z of the paper's equations, one position at a time in double.
std::vector<double> brute_force(const Tensor& h, const IndexTensor& ids, const Tensor& E, const Tensor& w, float b) {
  const int64_t B = h.dim(0), T = h.dim(1), C = h.dim(2), K = ids.shape[2];
  std::vector<double> z(static_cast<size_t>(B * T * C));
  for (int64_t r = 0; r < B * T; ++r) {
    const float* hr = h.data() + r * C;
    std::vector<double> s(static_cast<size_t>(K), -std::numeric_limits<double>::infinity());
    double top = -std::numeric_limits<double>::infinity(), gate = b;
    for (int64_t c = 0; c < C; ++c) gate += static_cast<double>(w.data()[c]) * hr[c];
    for (int64_t k = 0; k < K; ++k) {
      const int32_t y = ids.data[static_cast<size_t>(r * K + k)];
      if (y < 0) continue;
      s[k] = 0;
      for (int64_t c = 0; c < C; ++c) s[k] += static_cast<double>(E.data()[y * C + c]) * hr[c];
      top = std::max(top, s[k]);
    }
    const double g = std::isinf(top) ? 1.0 : 1 / (1 + std::exp(-gate));
    double norm = 0;
    for (int64_t k = 0; k < K; ++k) norm += std::isinf(s[k]) ? 0 : std::exp(s[k] - top);
    for (int64_t c = 0; c < C; ++c) {
      double m = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int32_t y = ids.data[static_cast<size_t>(r * K + k)];
        if (y >= 0) m += std::exp(s[k] - top) / norm * E.data()[y * C + c];
      }
      z[static_cast<size_t>(r * C + c)] = g * hr[c] + (1 - g) * m;
    }
  }
  return z;
}

void set_gate(SpalmLM& model, float weight, float bias) {
  model.gate->weight.value().copy_from(Tensor::full({model.config().n_embd, 1}, weight));
  model.gate->bias.value().copy_from(Tensor::full({1}, bias));
}

}  // namespace

// The model on ids with its retrieved tokens as the extra input "retrieved" (memory: null for none).
static Var with_retrieved(const LanguageModel& m, const IndexTensor& ids, const IndexTensor& retrieved, SegmentMemory* memory,
                   Rng& rng) {
  const ModelInputs inputs{{SpalmLM::kRetrieved, retrieved}};
  ModelContext ctx;
  ctx.rng = &rng;
  ctx.memory = memory;
  ctx.inputs = &inputs;
  return m.forward(ids, ctx);
}

TEST_CASE("spalm_mix: attention over the retrieved tokens' embeddings and the gate, as a brute-force loop") {
  const int64_t B = 2, T = 3, C = 5, K = 4, V = 11;
  Rng rng(7);
  const Tensor h = normal({B, T, C}, rng), E = normal({V, C}, rng), w = normal({C, 1}, rng);
  for (const double missing : {0.0, 0.4}) {
    CAPTURE(missing);
    const IndexTensor ids = retrieved_ids(B, T, K, 3, missing);
    const Tensor z = spalm_mix(Var(h), ids, Var(E), Var(w), Var(Tensor::full({1}, 0.3f))).value().contiguous();
    const std::vector<double> want = brute_force(h, ids, E, w, 0.3f);
    REQUIRE(z.shape() == Shape({B, T, C}));
    for (int64_t i = 0; i < z.numel(); ++i) CHECK(z.data()[i] == doctest::Approx(want[i]).epsilon(1e-5));
  }
}

TEST_CASE("spalm_mix: a position with no neighbour keeps h exactly; -1s are left out of the softmax") {
  const int64_t C = 4, V = 11;
  Rng rng(9);
  const Tensor h = normal({1, 2, C}, rng), E = normal({V, C}, rng), w = normal({C, 1}, rng);
  // Position 0 found nothing; position 1 found token 5 alone, so m = E[5].
  const IndexTensor ids({1, 2, 3}, {-1, -1, -1, -1, 5, -1});
  const Tensor z = spalm_mix(Var(h), ids, Var(E), Var(w), Var(Tensor::full({1}, -0.2f))).value().contiguous();
  for (int64_t c = 0; c < C; ++c) CHECK(z.data()[c] == h.data()[c]);
  double gate = -0.2;
  for (int64_t c = 0; c < C; ++c) gate += static_cast<double>(w.data()[c]) * h.data()[C + c];
  const double g = 1 / (1 + std::exp(-gate));
  for (int64_t c = 0; c < C; ++c)
    CHECK(z.data()[C + c] == doctest::Approx(g * h.data()[C + c] + (1 - g) * E.data()[5 * C + c]).epsilon(1e-5));
}

TEST_CASE("spalm_mix: gradients of h, the embedding and the gate against finite differences") {
  const int64_t B = 2, T = 3, C = 4, K = 3, V = 7;
  Rng rng(11);
  std::vector<int32_t> v(static_cast<size_t>(B * T * K));
  for (auto& x : v) x = static_cast<int32_t>(rng.below(V));
  v[4] = -1;                     // one missing neighbour
  v[6] = v[7] = v[8] = -1;       // one position with none
  v[9] = v[10];                  // a token retrieved twice: its embedding's gradient adds up
  const IndexTensor ids({B, T, K}, v);
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Var>& x) { return spalm_mix(x[0], ids, x[1], x[2], x[3]); },
      {normal({B, T, C}, rng), normal({V, C}, rng), normal({C, 1}, rng), Tensor::full({1}, 0.4f)}, "spalm_mix");
  CHECK_MESSAGE(r.ok, r.message);
  CHECK(r.checked == B * T * C + V * C + C + 1);
}

TEST_CASE("SPALM with its gate closed is the Transformer-XL, bit for bit, over several segments") {
  const ModelConfig cfg = spalm_config(3);
  Rng init(4);
  SpalmLM spalm(cfg, init);
  ModelConfig xl_cfg = memory_models::tiny_config(4);
  Rng unused(0);
  TransformerLM xl(xl_cfg, unused);
  xl.load_state(spalm.lm->state());
  spalm.eval();
  xl.eval();
  for (const float bias : {std::numeric_limits<float>::infinity(), 40.0f}) {
    CAPTURE(bias);
    set_gate(spalm, bias == 40.0f ? 0.0f : 0.5f, bias);
    SegmentMemory a, b;
    Rng rng(1);
    for (uint64_t s = 0; s < 4; ++s) {
      const IndexTensor ids = segment(2, 4, 100 + s);
      const Tensor want = xl.forward(ids, a, rng).value().contiguous();
      const Tensor got = with_retrieved(spalm, ids, retrieved_ids(2, 4, 3, 200 + s, 0.2), &b, rng).value().contiguous();
      REQUIRE(got.shape() == want.shape());
      bool same = true;
      for (int64_t i = 0; i < got.numel(); ++i) same = same && got.data()[i] == want.data()[i];
      CHECK_MESSAGE(same, "segment ", s);
    }
  }
  // And with the gate open the retrieved tokens change the logits.
  set_gate(spalm, 0.0f, 0.0f);
  SegmentMemory a, b;
  Rng rng(1);
  const IndexTensor ids = segment(2, 4, 100);
  const Tensor want = xl.forward(ids, a, rng).value().contiguous();
  const Tensor got = with_retrieved(spalm, ids, retrieved_ids(2, 4, 3, 200), &b, rng).value().contiguous();
  double diff = 0;
  for (int64_t i = 0; i < got.numel(); ++i) diff += std::abs(got.data()[i] - want.data()[i]);
  CHECK(diff > 1e-3);
}

TEST_CASE("SPALM: the XL's checkpoint keys plus the gate; parameters as its footprint says; gate starts at its bias") {
  ModelConfig cfg = spalm_config(2);
  cfg.options["spalm_gate_bias"] = 1.5;
  Rng rng(2);
  SpalmLM spalm(cfg, rng);
  Rng rng2(2);
  TransformerLM xl(memory_models::tiny_config(4), rng2);
  CHECK(spalm.state().size() == xl.state().size() + 2);
  CHECK(spalm.num_parameters() == xl.num_parameters() + 16 + 1);
  CHECK(static_cast<double>(spalm.num_parameters()) == model_footprint(cfg).parameters);
  bool weight = false, bias = false;
  for (const auto& [name, t] : spalm.state()) {
    if (name == "spalm_gate.weight") weight = t.shape() == Shape({16, 1}) && t.contiguous().data()[3] == 0.0f;
    if (name == "spalm_gate.bias") bias = t.contiguous().data()[0] == 1.5f;
  }
  CHECK(weight);
  CHECK(bias);
  CHECK(spalm.k() == 2);
}

TEST_CASE("SPALM refuses: no memory, K out of range, no retrieved tokens, wrong shapes and ids") {
  Rng rng(1);
  ModelConfig no_mem = spalm_config(2);
  no_mem.options["mem_len"] = int64_t{0};
  expect_error([&] { SpalmLM m(no_mem, rng); }, {"model.mem_len > 0"});
  expect_error([&] { SpalmLM m(spalm_config(0), rng); }, {"model.spalm_k must be in [1, 4096], got 0"});
  ModelConfig plain = memory_models::tiny_config(4);
  plain.options["spalm_k"] = int64_t{3};
  expect_error([&] { plain.validate(); }, {"model.spalm_k", "model.arch \"spalm\""});

  SpalmLM m(spalm_config(2), rng);
  const IndexTensor ids = segment(1, 4, 1);
  SegmentMemory mem;
  expect_error([&] { m.forward(ids, rng); }, {"spalm", "retrieved tokens", "inputs[\"retrieved\"]"});
  expect_error([&] { m.forward(ids, mem, rng); }, {"spalm", "retrieved tokens"});
  const std::unique_ptr<InferenceState> state = m.make_state(1);
  expect_error([&] { m.forward(ids, *state); }, {"spalm", "retrieved tokens"});
  expect_error([&] { with_retrieved(m, ids, retrieved_ids(1, 4, 3, 1), &mem, rng); },
               {"retrieved must be (B, T, 2)", "[1, 4, 3]"});
  expect_error([&] { with_retrieved(m, ids, IndexTensor({1, 4, 2}, {0, 1, 2, 3, 4, 5, 6, 11}), &mem, rng); },
               {"retrieved token 11", "outside [-1, 11)"});
  expect_error([&] { with_retrieved(m, ids, retrieved_ids(1, 3, 2, 1), &mem, rng); }, {"spalm_mix", "(1, 4, K"});
  TransformerLM xl(memory_models::tiny_config(4), rng);
  expect_error([&] { with_retrieved(xl, ids, retrieved_ids(1, 4, 2, 1), &mem, rng); },
               {"reads no extra inputs", "\"retrieved\""});
}
