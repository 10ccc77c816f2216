// Compressive Transformer memory (Rae et al. 2019): pooling against a loop
// written here, the limit case (ratio 1, mean: the compressed memory holds
// exactly the rows a longer Transformer-XL memory would, so the logits are
// the same bits), the compressed memory's growth and bound, causality with
// both memories full, and the config checks. The learned compression: a
// convolution against a loop, mean at initialisation, and the
// attention-reconstruction loss's gradient reaching the compression alone
// (its values against PyTorch: tests/autograd/test_golden.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/memory/compressive.h"
#include "tapeformer/layers/transformer.h"
#include "memory_models.h"

using namespace tapeformer;
using memory_models::group_of;
using memory_models::held;
using memory_models::normal;
using memory_models::segment;

namespace {

ModelConfig compressive_config(int64_t mem_len, int64_t cmem_len, int64_t ratio, const std::string& fn,
                               const std::string& block = "standard") {
  ModelConfig c = memory_models::tiny_config(mem_len, block);
  if (cmem_len > 0) {
    c.options["cmem_len"] = cmem_len;
    c.options["cmem_ratio"] = ratio;
    c.options["cmem_fn"] = fn;
  }
  return c;
}

// The logits of `segments` consecutive segments read with one memory.
std::vector<std::vector<float>> read_segments(const ModelConfig& cfg, int segments, SegmentMemory& memory) {
  Rng init(5);
  TransformerLM model(cfg, init);
  model.eval();
  NoGradGuard no_grad;
  Rng unused(0);
  std::vector<std::vector<float>> out;
  for (int s = 0; s < segments; ++s) out.push_back(model.forward(segment(2, 4, 100 + s), memory, unused).value().to_vector());
  return out;
}

}  // namespace

TEST_CASE("compress_rows: mean and max over each c rows, the oldest remainder dropped") {
  // (1, 5, 2): rows r = 0..4 hold (r, -r * r); c = 2 pools rows (1, 2) and (3, 4), row 0 dropped.
  std::vector<float> v;
  for (int r = 0; r < 5; ++r) v.insert(v.end(), {static_cast<float>(r), static_cast<float>(-r * r)});
  const Tensor rows = Tensor::from({1, 5, 2}, v);
  MemoryCompression c;
  c.ratio = 2;
  c.fn = "mean";
  CHECK(compress_rows(rows, c).to_vector() == std::vector<float>{1.5f, -2.5f, 3.5f, -12.5f});
  c.fn = "max";
  CHECK(compress_rows(rows, c).to_vector() == std::vector<float>{2.0f, -1.0f, 4.0f, -9.0f});
  c.ratio = 1;
  CHECK(compress_rows(rows, c).to_vector() == v);
  c.ratio = 6;
  CHECK(compress_rows(rows, c).dim(1) == 0);
}

TEST_CASE("compressive, ratio 1 and mean: the same logits as Transformer-XL with the longer memory") {
  for (const std::string& block : memory_models::memory_blocks()) {
    CAPTURE(block);
    SegmentMemory xl, cm;
    const auto longer = read_segments(compressive_config(12, 0, 1, "mean", block), 6, xl);
    const auto compressed = read_segments(compressive_config(4, 8, 1, "mean", block), 6, cm);
    for (size_t s = 0; s < longer.size(); ++s) CHECK(compressed[s] == longer[s]);
    CHECK(held(xl, "layers") == 12);
    CHECK(held(cm, "layers") == 4);
    CHECK(held(cm, "compressed") == 8);
  }
  // With c = 2 the compressed memory is not the XL memory: the logits differ once rows fall out.
  SegmentMemory xl, cm;
  const auto longer = read_segments(compressive_config(12, 0, 1, "mean"), 4, xl);
  const auto pooled = read_segments(compressive_config(4, 8, 2, "mean"), 4, cm);
  CHECK(pooled[1] == longer[1]);  // nothing has fallen out of a memory of 4 yet
  CHECK(pooled[3] != longer[3]);
}

TEST_CASE("compressive: the compressed memory grows by T / c rows per segment and keeps its last cmem_len") {
  SegmentMemory memory;
  Rng init(1);
  TransformerLM model(compressive_config(4, 6, 2, "max"), init);
  NoGradGuard no_grad;
  Rng unused(0);
  const int64_t expected[] = {0, 2, 4, 6, 6};  // after segments 1..5 of T = 4: 4 rows fall out from segment 2 on
  for (int s = 0; s < 5; ++s) {
    model.forward(segment(2, 4, 7 + s), memory, unused);
    CHECK(held(memory, "layers") == 4);
    CHECK(held(memory, "compressed") == expected[s]);
  }
  // The oldest compressed rows dropped, the newest kept: one more segment shifts them by two.
  const std::vector<float> before = group_of(memory, "compressed")[0].to_vector();
  model.forward(segment(2, 4, 20), memory, unused);
  const std::vector<float> after = group_of(memory, "compressed")[0].to_vector();
  const size_t C = 16, per_row = 6 * C;
  for (size_t b = 0; b < 2; ++b)
    CHECK(std::equal(after.begin() + b * per_row, after.begin() + b * per_row + 4 * C,
                     before.begin() + b * per_row + 2 * C));
}

TEST_CASE("compressive: causal with both memories full; a changed later token moves no earlier logit") {
  Rng init(2);
  TransformerLM model(compressive_config(4, 4, 2, "mean"), init);
  model.eval();
  NoGradGuard no_grad;
  Rng unused(0);
  SegmentMemory memory;
  for (int s = 0; s < 5; ++s) model.forward(segment(1, 4, 30 + s), memory, unused);
  REQUIRE(held(memory, "compressed") == 4);
  SegmentMemory copy = memory;
  IndexTensor ids = segment(1, 4, 50), changed = ids;
  changed.data[3] = (changed.data[3] + 1) % 11;
  const std::vector<float> a = model.forward(ids, memory, unused).value().to_vector();
  const std::vector<float> b = model.forward(changed, copy, unused).value().to_vector();
  CHECK(std::equal(a.begin(), a.begin() + 3 * 11, b.begin()));
  CHECK(!std::equal(a.begin() + 3 * 11, a.end(), b.begin() + 3 * 11));
}

TEST_CASE("compressive configs: what cannot work is refused naming the key") {
  Rng rng(0);
  const auto refused = [&](ModelConfig c, const char* message) {
    CHECK_THROWS_WITH_AS(TransformerLM(c, rng), doctest::Contains(message), Error);
  };
  refused(compressive_config(0, 4, 2, "mean"), "model.cmem_len = 4 compresses what falls out of the memory");
  refused(compressive_config(4, 4, 3, "mean"), "model.cmem_ratio = 3 must divide model.mem_len (4)");
  refused(compressive_config(4, 4, 2, "median"), "model.cmem_fn must be \"mean\", \"max\" or \"conv\"");
  refused(compressive_config(4, 4, 0, "mean"), "model.cmem_ratio must be in [1, 1024]");
  ModelConfig unused_ratio = compressive_config(4, 0, 2, "mean");
  unused_ratio.options["cmem_ratio"] = int64_t{4};
  refused(unused_ratio, "model.cmem_ratio and model.cmem_fn apply only with a compressed memory");
}

TEST_CASE("compressive conv: a strided convolution, kernel = stride = c, against a loop") {
  const int64_t B = 2, n = 6, C = 3, c = 3;
  ConvCompression conv(/*n_layer=*/2, C, c);
  Rng rng(4);
  for (Var& w : conv.weights) w.value().copy_from(normal({c * C, C}, rng));
  for (Var& b : conv.biases) b.value().copy_from(normal({C}, rng));
  const Tensor rows = normal({B, n, C}, rng);
  const Tensor got = conv.forward(1, Var(rows)).value();  // (B, n / c, C)
  REQUIRE(got.shape() == Shape({B, n / c, C}));
  const Tensor &w = conv.weights[1].value(), &bias = conv.biases[1].value();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < n / c; ++k)
      for (int64_t o = 0; o < C; ++o) {
        double y = bias.data()[o];  // y_k[o] = b[o] + sum_i sum_j rows[kc + i][j] W_i[j, o]
        for (int64_t i = 0; i < c; ++i)
          for (int64_t j = 0; j < C; ++j) y += rows.data()[(b * n + k * c + i) * C + j] * w.data()[(i * C + j) * C + o];
        CHECK(got.data()[(b * n / c + k) * C + o] == doctest::Approx(y).epsilon(1e-5));
      }
  CHECK_THROWS_WITH_AS(conv.forward(0, Var(Tensor::zeros({B, 4, C}))), doctest::Contains("multiple of 3"), Error);
}

TEST_CASE("compressive conv: starts as the mean, and its parameters are counted") {
  SegmentMemory mean_memory, conv_memory;
  const auto mean = read_segments(compressive_config(4, 8, 2, "mean"), 6, mean_memory);
  const auto conv = read_segments(compressive_config(4, 8, 2, "conv"), 6, conv_memory);
  REQUIRE(held(conv_memory, "compressed") == 8);
  for (size_t s = 0; s < mean.size(); ++s)
    for (size_t i = 0; i < mean[s].size(); ++i) CHECK(conv[s][i] == doctest::Approx(mean[s][i]).epsilon(1e-5));
  const ModelConfig cfg = compressive_config(4, 8, 2, "conv");
  Rng rng(0);
  TransformerLM model(cfg, rng);
  CHECK(TransformerLM::footprint(cfg).parameters == static_cast<double>(model.num_parameters()));
  CHECK(model.num_parameters() - TransformerLM(compressive_config(4, 8, 2, "mean"), rng).num_parameters() ==
        2 * (2 * 16 * 16 + 16));  // n_layer (c C C + C)
  const NamedVars params = model.named_parameters();
  CHECK(std::count_if(params.begin(), params.end(), [](const auto& p) { return p.first == "compress.1.weight"; }) == 1);
}

TEST_CASE("compressive conv: the reconstruction loss trains the compression alone; the LM loss never reaches it") {
  for (const std::string& block : memory_models::memory_blocks()) {
    CAPTURE(block);
    Rng init(3);
    TransformerLM model(compressive_config(4, 8, 2, "conv", block), init);
    model.train();
    // The parameters a loss's gradient reaches, after a fresh forward over two segments.
    const auto reached_by = [&](bool reconstruction) {
      Rng rng(0);
      SegmentMemory memory;
      model.forward(segment(2, 4, 60), memory, rng);  // fills the memory: nothing falls out yet
      CHECK_FALSE(model.auxiliary_loss(/*of_batch=*/true).defined());
      const Var logits = model.forward(segment(2, 4, 61), memory, rng);  // 4 rows fall out per layer
      const Var aux = model.auxiliary_loss(/*of_batch=*/true);  // the one channel of auxiliary losses
      REQUIRE(aux.defined());
      CHECK(aux.item() > 0);
      CHECK_FALSE(model.auxiliary_loss(/*of_batch=*/false).defined());  // nothing of the parameters alone
      for (const auto& named : model.named_parameters()) named.second.zero_grad();
      backward(reconstruction ? aux : cross_entropy(logits, segment(2, 4, 62)));
      std::vector<std::string> reached;
      for (const auto& [name, p] : model.named_parameters()) {
        if (!p.has_grad()) continue;
        const std::vector<float> g = p.grad().to_vector();
        if (std::any_of(g.begin(), g.end(), [](float x) { return x != 0.0f; })) reached.push_back(name);
      }
      return reached;
    };
    CHECK(reached_by(true) == std::vector<std::string>{"compress.0.weight", "compress.0.bias", "compress.1.weight",
                                                       "compress.1.bias"});
    const std::vector<std::string> lm = reached_by(false);
    CHECK(lm.size() > 10);
    for (const std::string& name : lm) CHECK(name.rfind("compress.", 0) != 0);
    Rng rng(0);
    SegmentMemory memory;
    for (int s = 0; s < 2; ++s) model.forward(segment(2, 4, 60 + s), memory, rng);
    // Without gradient (evaluation) there is no reconstruction loss.
    NoGradGuard no_grad;
    model.forward(segment(2, 4, 63), memory, rng);
    CHECK_FALSE(model.auxiliary_loss(/*of_batch=*/true).defined());
  }
}

TEST_CASE("compressive sampling state: token by token equals the segments read with both memories") {
  for (const std::string fn : {"mean", "conv"}) {
    CAPTURE(fn);
    const ModelConfig cfg = compressive_config(4, 4, 2, fn);
    Rng init(8);
    TransformerLM model(cfg, init);
    model.eval();
    NoGradGuard no_grad;
    // 5 segments of 4 and 2 more tokens; by the 4th segment rows have been compressed.
    const IndexTensor ids = segment(2, 22, 70);
    const auto columns = [&](int64_t t0, int64_t t1) {
      std::vector<int32_t> v;
      for (int64_t b = 0; b < 2; ++b) v.insert(v.end(), ids.data.begin() + b * 22 + t0, ids.data.begin() + b * 22 + t1);
      return IndexTensor({2, t1 - t0}, v);
    };
    SegmentMemory memory;
    Rng unused(0);
    std::vector<Tensor> expected;  // (2, t, V) per segment
    for (int64_t t0 = 0; t0 < 22; t0 += 4) expected.push_back(model.forward(columns(t0, std::min<int64_t>(t0 + 4, 22)), memory, unused).value());
    const auto state = model.make_state(2, /*window=*/3);  // the window is ignored
    for (int64_t t = 0; t < 22;) {
      const int64_t n = t == 5 ? 3 : 1;  // one piece crosses a segment boundary
      const Tensor got = model.forward(columns(t, t + n), *state).value();  // (2, n, V)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t v = 0; v < 11; ++v) {
            const int64_t pos = t + j, s = pos / 4, r = pos % 4, len = expected[static_cast<size_t>(s)].dim(1);
            CHECK(got.data()[(b * n + j) * 11 + v] ==
                  doctest::Approx(expected[static_cast<size_t>(s)].data()[(b * len + r) * 11 + v]).epsilon(1e-5));
          }
      t += n;
    }
    CHECK(state->length() == 22);
    REQUIRE(held(memory, "compressed") == 4);
    // Fed whole after a reset: the same rows again.
    state->reset();
    const Tensor whole = model.forward(ids, *state).value();  // (2, 22, V)
    CHECK(whole.dim(1) == 22);
    CHECK(whole.data()[(22 + 21) * 11] == doctest::Approx(expected[5].data()[(2 + 1) * 11]).epsilon(1e-5));
  }
}
