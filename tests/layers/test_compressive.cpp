// Compressive Transformer memory (Rae et al. 2019): pooling against a loop
// written here, the limit case (ratio 1, mean: the compressed memory holds
// exactly the rows a longer Transformer-XL memory would, so the logits are
// the same bits), the compressed memory's growth and bound, causality with
// both memories full, and the config checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/layers/transformer.h"

using namespace tapeformer;

namespace {

ModelConfig compressive_config(int64_t mem_len, int64_t cmem_len, int64_t ratio, const std::string& fn,
                               const std::string& block = "standard") {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 4;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.positional = "txl";
  c.block = block;
  c.options["mem_len"] = mem_len;
  if (cmem_len > 0) {
    c.options["cmem_len"] = cmem_len;
    c.options["cmem_ratio"] = ratio;
    c.options["cmem_fn"] = fn;
  }
  return c;
}

IndexTensor segment(int64_t B, int64_t T, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(B * T));
  for (auto& x : v) x = static_cast<int32_t>(rng.below(11));
  return IndexTensor({B, T}, v);
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
  for (const std::string block : {"standard", "post_ln", "gtrxl"}) {
    CAPTURE(block);
    SegmentMemory xl, cm;
    const auto longer = read_segments(compressive_config(12, 0, 1, "mean", block), 6, xl);
    const auto compressed = read_segments(compressive_config(4, 8, 1, "mean", block), 6, cm);
    for (size_t s = 0; s < longer.size(); ++s) CHECK(compressed[s] == longer[s]);
    CHECK(xl.length() == 12);
    CHECK(cm.length() == 4);
    CHECK(cm.compressed_length() == 8);
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
    CHECK(memory.length() == 4);
    CHECK(memory.compressed_length() == expected[s]);
  }
  // The oldest compressed rows dropped, the newest kept: one more segment shifts them by two.
  const std::vector<float> before = memory.compressed[0].to_vector();
  model.forward(segment(2, 4, 20), memory, unused);
  const std::vector<float> after = memory.compressed[0].to_vector();
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
  REQUIRE(memory.compressed_length() == 4);
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
  refused(compressive_config(4, 4, 2, "median"), "model.cmem_fn must be \"mean\" or \"max\"");
  refused(compressive_config(4, 4, 0, "mean"), "model.cmem_ratio must be in [1, 1024]");
  ModelConfig unused_ratio = compressive_config(4, 0, 2, "mean");
  unused_ratio.options["cmem_ratio"] = int64_t{4};
  refused(unused_ratio, "model.cmem_ratio and model.cmem_fn apply only with a compressed memory");
}
