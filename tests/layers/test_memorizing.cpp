// Memorizing Transformer (Wu et al. 2022): retrieval against a brute-force
// loop, its gradient against finite differences, the limit case (gate
// closed: the same logits as the model without the external memory, bit for
// bit), the memory's growth and bound, causality with the memory full,
// gradients (the queries and the gate, never the memory), sampling, and the
// config checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/softmax.h"
#include "tapeformer/layers/memory/memorizing.h"
#include "tapeformer/layers/transformer.h"
#include "memory_models.h"

using namespace tapeformer;
using memory_models::group_of;
using memory_models::held;
using memory_models::normal;
using memory_models::segment;

namespace {

ModelConfig memorizing_config(int64_t xmem_len, int64_t top_k = 4, const std::string& block = "standard") {
  ModelConfig c = memory_models::tiny_config(4, block);
  if (xmem_len != 0) {
    c.options["xmem_len"] = xmem_len;
    c.options["xmem_topk"] = top_k;
  }
  return c;
}

// Sets the memorizing layer's gate logits b (its parameter "....attn.xmem_gate") to `value`.
void set_gate(TransformerLM& model, float value) {
  int found = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    if (name.find("xmem_gate") == std::string::npos) continue;
    CHECK(name == "0.attn.xmem_gate");
    Tensor storage = p.value();  // shares the parameter's storage
    storage.copy_from(Tensor::full(storage.shape(), value));
    ++found;
  }
  REQUIRE(found == 1);
}

// The memorizing layer's gate (layer 0 of 2: the one below the top).
Var gate_of(TransformerLM& model) {
  for (const auto& [name, p] : model.named_parameters())
    if (name == "0.attn.xmem_gate") return p;
  FAIL("no memorizing layer");
  return Var();
}

std::vector<std::vector<float>> read_segments(TransformerLM& model, int segments, SegmentMemory& memory) {
  model.eval();
  NoGradGuard no_grad;
  Rng unused(0);
  std::vector<std::vector<float>> out;
  for (int s = 0; s < segments; ++s) out.push_back(model.forward(segment(2, 4, 100 + s), memory, unused).value().to_vector());
  return out;
}

}  // namespace

TEST_CASE("retrieved attention: the top k by cosine, softmax of tau times cosine over them, against a loop") {
  const int64_t B = 2, H = 2, T = 3, D = 4, N = 7;
  Rng rng(1);
  Tensor keys, values;
  ExternalMemory mem{&keys, &values, /*capacity=*/16, 3};
  const Tensor k_in = normal({B, H, N, D}, rng), v_in = normal({B, H, N, D}, rng);
  mem.append(k_in, v_in);  // keys stored as unit vectors
  const Tensor q = normal({B, H, T, D}, rng);
  const double tau[H] = {1.5, 3.0};
  const Var log_scale(Tensor::from({H}, {static_cast<float>(std::log(tau[0])), static_cast<float>(std::log(tau[1]))}));
  for (int64_t k : {int64_t{3}, int64_t{7}, int64_t{9}}) {
    CAPTURE(k);
    mem.top_k = k;
    const Tensor y = retrieved_attention(Var(q), mem, log_scale).value();  // (B, H, T, D)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) {
          std::vector<std::pair<double, int64_t>> s;  // (cosine, j)
          for (int64_t j = 0; j < N; ++j) {
            double dot = 0, qq = 0, kk = 0;
            for (int64_t d = 0; d < D; ++d) {
              const double qd = q.data()[((b * H + h) * T + t) * D + d], kd = k_in.data()[((b * H + h) * N + j) * D + d];
              dot += qd * kd;
              qq += qd * qd;
              kk += kd * kd;
            }
            s.push_back({dot / std::sqrt(qq * kk), j});
          }
          std::sort(s.begin(), s.end(), [](const auto& x, const auto& z) { return x.first > z.first; });
          s.resize(static_cast<size_t>(std::min(k, N)));
          double z = 0;
          for (const auto& [cosine, j] : s) z += std::exp(tau[h] * cosine);
          for (int64_t d = 0; d < D; ++d) {
            double expected = 0;
            for (const auto& [cosine, j] : s)
              expected += std::exp(tau[h] * cosine) / z * v_in.data()[((b * H + h) * N + j) * D + d];
            CHECK(y.data()[((b * H + h) * T + t) * D + d] == doctest::Approx(expected).epsilon(1e-5));
          }
        }
  }
}

TEST_CASE("retrieved attention: its gradient to the queries and temperatures against finite differences") {
  const int64_t B = 1, H = 2, T = 3, D = 4, N = 6;
  Rng rng(2);
  Tensor keys, values;
  ExternalMemory mem{&keys, &values, 16, 3};
  mem.append(normal({B, H, N, D}, rng), normal({B, H, N, D}, rng));
  const GradcheckResult r =
      gradcheck([&](const std::vector<Var>& v) { return retrieved_attention(v[0], mem, v[1]); },
                {normal({B, H, T, D}, rng), Tensor::from({H}, {0.3f, 1.1f})}, "retrieved_attention");
  CHECK_MESSAGE(r.ok, r.message);
  CHECK(r.checked == B * H * T * D + H);
}

TEST_CASE("external memory: appended oldest first, bounded by its capacity, copies unaffected") {
  Tensor keys, values;
  ExternalMemory mem{&keys, &values, /*capacity=*/5, 2};
  Rng rng(3);
  const Tensor k1 = normal({1, 2, 3, 2}, rng), k2 = normal({1, 2, 3, 2}, rng);
  mem.append(k1, k1);
  CHECK(mem.length() == 3);
  const Tensor before = keys;
  mem.append(k2, k2);
  CHECK(mem.length() == 5);       // 6 positions, the oldest dropped
  CHECK(before.dim(1) == 3);      // the earlier tensor is not changed in place
  // Row 0 now holds k1's second position: head h's 2 values at columns [2h, 2h + 2),
  // the key scaled to unit length, the value as it came.
  const auto unit = [](const Tensor& k, int64_t at, int64_t d) {
    const float x = k.data()[at], y = k.data()[at + 1];
    return doctest::Approx(k.data()[at + d] / std::sqrt(x * x + y * y)).epsilon(1e-6);
  };
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t d = 0; d < 2; ++d) {
      CHECK(keys.data()[h * 2 + d] == unit(k1, (h * 3 + 1) * 2, d));
      CHECK(values.data()[h * 2 + d] == k1.data()[(h * 3 + 1) * 2 + d]);
      CHECK(keys.data()[4 * 4 + h * 2 + d] == unit(k2, (h * 3 + 2) * 2, d));
    }
}

TEST_CASE("memorizing, gate closed: the same logits as the model without the external memory, bit for bit") {
  for (const std::string& block : memory_models::memory_blocks()) {
    CAPTURE(block);
    Rng a(5), b(5);
    TransformerLM local(memorizing_config(0, 4, block), a), memorizing(memorizing_config(12, 4, block), b);
    CHECK(memorizing.num_parameters() == local.num_parameters() + 2 * 2);  // the gate b and temperature s, per head
    set_gate(memorizing, -INFINITY);
    SegmentMemory m1, m2;
    const auto expected = read_segments(local, 6, m1);
    const auto got = read_segments(memorizing, 6, m2);
    for (size_t s = 0; s < got.size(); ++s) CHECK(got[s] == expected[s]);
    CHECK(held(m2, "external") == 12);
    // Open (b = 0, g = 1/2), the memory moves the logits once it holds positions.
    set_gate(memorizing, 0.0f);
    SegmentMemory m3;
    const auto open = read_segments(memorizing, 3, m3);
    CHECK(open[0] == expected[0]);  // the first segment finds the memory empty
    CHECK(open[2] != expected[2]);
  }
}

TEST_CASE("memorizing: the memory grows by T per segment up to xmem_len; causal with it full") {
  Rng init(6);
  TransformerLM model(memorizing_config(10, 3), init);
  model.eval();
  NoGradGuard no_grad;
  Rng unused(0);
  SegmentMemory memory;
  const int64_t expected[] = {4, 8, 10, 10};
  for (int s = 0; s < 4; ++s) {
    model.forward(segment(2, 4, 30 + s), memory, unused);
    CHECK(held(memory, "external") == expected[s]);
    CHECK(group_of(memory, "external")[1].dim(1) == expected[s]);
  }
  SegmentMemory copy = memory;
  IndexTensor ids = segment(2, 4, 50), changed = ids;
  changed.data[3] = (changed.data[3] + 1) % 11;  // sequence 0's last token
  const std::vector<float> a = model.forward(ids, memory, unused).value().to_vector();
  const std::vector<float> b = model.forward(changed, copy, unused).value().to_vector();
  CHECK(std::equal(a.begin(), a.begin() + 3 * 11, b.begin()));
  CHECK(!std::equal(a.begin() + 3 * 11, a.begin() + 4 * 11, b.begin() + 3 * 11));
  CHECK(std::equal(a.begin() + 4 * 11, a.end(), b.begin() + 4 * 11));  // sequence 1 is its own
}

TEST_CASE("memorizing: the gradient reaches the gate and the queries, the stored keys and values none") {
  Rng init(7);
  TransformerLM model(memorizing_config(12, 4), init);
  model.train();
  Rng rng(0);
  SegmentMemory memory;
  model.forward(segment(2, 4, 60), memory, rng);
  const Var logits = model.forward(segment(2, 4, 61), memory, rng);
  backward(cross_entropy(logits, segment(2, 4, 62)));
  const Var gate = gate_of(model);
  REQUIRE(gate.has_grad());
  const std::vector<float> g = gate.grad().to_vector();
  CHECK(std::any_of(g.begin(), g.end(), [](float x) { return x != 0.0f; }));
  for (const Tensor& t : group_of(memory, "external")) CHECK(t.dim(1) == 8);
}

TEST_CASE("memorizing sampling state: token by token equals the segments read with the external memory") {
  Rng init(8);
  TransformerLM model(memorizing_config(8, 3), init);
  model.eval();
  NoGradGuard no_grad;
  const IndexTensor ids = segment(1, 14, 70);
  SegmentMemory memory;
  Rng unused(0);
  std::vector<float> expected;
  for (int64_t t0 = 0; t0 < 14; t0 += 4) {
    const int64_t t1 = std::min<int64_t>(t0 + 4, 14);
    const IndexTensor piece({1, t1 - t0}, std::vector<int32_t>(ids.data.begin() + t0, ids.data.begin() + t1));
    const std::vector<float> v = model.forward(piece, memory, unused).value().to_vector();
    expected.insert(expected.end(), v.begin(), v.end());
  }
  const auto state = model.make_state(1);
  std::vector<float> got;
  for (int64_t t = 0; t < 14; ++t) {
    const std::vector<float> v = model.forward(IndexTensor({1, 1}, {ids.data[static_cast<size_t>(t)]}), *state).value().to_vector();
    got.insert(got.end(), v.begin(), v.end());
  }
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-5));
}

TEST_CASE("memorizing configs: what cannot work is refused naming the key") {
  Rng rng(0);
  const auto refused = [&](ModelConfig c, const char* message) {
    CHECK_THROWS_WITH_AS(TransformerLM(c, rng), doctest::Contains(message), Error);
  };
  ModelConfig no_memory = memorizing_config(8);
  no_memory.options["mem_len"] = int64_t{0};
  refused(no_memory, "model.xmem_len = 8 is carried across segments like the memory");
  refused(memorizing_config(8, 9), "model.xmem_topk must be in [1, model.xmem_len = 8]");
  ModelConfig layer = memorizing_config(8);
  layer.options["xmem_layer"] = int64_t{2};
  refused(layer, "model.xmem_layer must be in [-1, 1]");
  ModelConfig unused = memorizing_config(0);
  unused.options["xmem_topk"] = int64_t{4};
  refused(unused, "model.xmem_layer, model.xmem_topk and model.xmem_gate_bias apply only with an external memory");
  refused(memorizing_config(-1), "model.xmem_len must be in [0, 2^20]");
  ModelConfig bias = memorizing_config(8);
  bias.options["xmem_gate_bias"] = 31.0;
  refused(bias, "model.xmem_gate_bias must be a number in [-30, 30], got 31");
}

TEST_CASE("memorizing: model.xmem_gate_bias sets every head's gate bias at initialisation") {
  Rng rng(0);
  ModelConfig c = memorizing_config(8);
  for (double b : {0.0, -3.0}) {
    c.options["xmem_gate_bias"] = b;
    TransformerLM model(c, rng);
    bool found = false;
    for (const auto& [name, p] : model.named_parameters())
      if (name.find("xmem_gate") != std::string::npos) {
        found = true;
        for (int64_t h = 0; h < p.numel(); ++h) CHECK(p.value().data()[h] == static_cast<float>(b));
      }
    CHECK(found);
  }
}
