#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "tapeformer/core/error.h"
#include "sampling_stats.h"
#include "tapeformer/train/sample.h"

using namespace tapeformer;

namespace {

// Vocabulary 7, block size 4: small enough to check by hand.
ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 7;
  c.block_size = 4;
  c.n_layer = 1;
  c.n_head = 1;
  c.n_embd = 8;
  return c;
}

}  // namespace

TEST_CASE("sample_token: greedy, top-k and top-p restrict the support; frequencies follow softmax") {
  const std::vector<Scalar> logits{2.0f, 1.0f, 0.5f, -1.0f, 0.0f};
  // softmax(logits / temperature), in double, over the tokens in `keep`.
  const auto softmax = [&](double temperature, std::vector<int> keep) {
    std::vector<double> p(logits.size(), 0.0);
    double z = 0;
    for (int t : keep) z += p[t] = std::exp(logits[t] / temperature);
    for (double& x : p) x /= z;
    return p;
  };
  // Draws n tokens and checks each token's frequency against p (5 standard
  // errors; a token with p = 0 must never appear).
  Rng rng(1);
  const auto check_frequencies = [&](const SampleOptions& opt, const std::vector<double>& p, int n) {
    std::map<int32_t, int> counts;
    for (int i = 0; i < n; ++i) counts[sample_token(logits.data(), 5, opt, rng)]++;
    for (int t = 0; t < 5; ++t) {
      CAPTURE(t);
      CAPTURE(counts[t]);
      if (p[t] == 0) CHECK(counts[t] == 0);
      else CHECK(binomial_z(counts[t] / double(n), p[t], n) < kZ);
    }
  };

  SampleOptions greedy;
  greedy.temperature = 0;
  CHECK(sample_token(logits.data(), 5, greedy, rng) == 0);

  // top-k 2 renormalises over {0, 1}: p0 = e^2 / (e^2 + e^1) = 0.731.
  SampleOptions k2;
  k2.top_k = 2;
  check_frequencies(k2, softmax(1, {0, 1}), 20000);
  // top-k 4 drops only the least likely token (3).
  SampleOptions k4;
  k4.top_k = 4;
  check_frequencies(k4, softmax(1, {0, 1, 2, 4}), 50000);

  // top-p 0.6: p0 alone is 0.53 of the full softmax; adding p1 (0.20) crosses
  // 0.6, so the nucleus is {0, 1}, renormalised to 0.731 and 0.269.
  SampleOptions p;
  p.top_p = 0.6f;
  check_frequencies(p, softmax(1, {0, 1}), 20000);

  SampleOptions full;
  check_frequencies(full, softmax(1, {0, 1, 2, 3, 4}), 50000);

  // Temperature divides the logits: at 0.5 the distribution is softmax(2 * logits)
  // (p0 = 0.83; multiplying instead would give softmax(logits / 2), p0 = 0.37).
  SampleOptions cool;
  cool.temperature = 0.5f;
  check_frequencies(cool, softmax(0.5, {0, 1, 2, 3, 4}), 50000);
}

TEST_CASE("sample_token: NaN or inf logits are an error, not a silently chosen token") {
  Rng rng(1);
  SampleOptions opt;
  for (Scalar bad : {std::nanf(""), std::numeric_limits<Scalar>::infinity()}) {
    const std::vector<Scalar> logits{0.5f, bad, 0.1f};
    CHECK_THROWS_WITH_AS(sample_token(logits.data(), 3, opt, rng),
                         doctest::Contains("logit for token 1 is"), Error);
  }
}

TEST_CASE("generate: a sequence longer than the block size is cropped to its last block_size tokens") {
  Rng init(3);
  TransformerLM model(tiny_config(), init);
  for (auto& [name, p] : model.named_parameters()) init.fill_normal(p.value(), 0.0f, 0.5f);  // distinct logits
  model.eval();
  SampleOptions greedy;
  greedy.temperature = 0;
  greedy.tokens = 4;
  const std::vector<int32_t> prompt{1, 5, 2, 6, 0, 3};
  Rng rng(1);
  const std::vector<int32_t> out = generate(model, prompt, greedy, rng);
  REQUIRE(out.size() == prompt.size() + 4);
  NoGradGuard no_grad;
  Rng unused(0);
  const auto last_logits = [&](std::vector<int32_t> window) {
    const Tensor l = model.forward(IndexTensor({1, 4}, window), unused).value();
    return std::vector<Scalar>(l.data() + 3 * 7, l.data() + 4 * 7);
  };
  for (size_t n = prompt.size(); n < out.size(); ++n) {
    const std::vector<Scalar> right = last_logits({out.begin() + n - 4, out.begin() + n});
    const std::vector<Scalar> wrong = last_logits({out.begin() + n - 5, out.begin() + n - 1});  // off by one
    CHECK(right != wrong);  // the check below could tell the windows apart
    CHECK(out[n] == std::max_element(right.begin(), right.end()) - right.begin());
  }
}

TEST_CASE("generate (KV caches) draws what a full forward per token would, before and after the block fills") {
  Rng init(5);
  TransformerLM model(tiny_config(), init);
  for (auto& [name, p] : model.named_parameters()) init.fill_normal(p.value(), 0.0f, 0.5f);
  SampleOptions opt;
  opt.tokens = 9;  // prompt 2 + 9 crosses block size 4
  opt.top_k = 5;
  Rng a(17);
  const std::vector<int32_t> out = generate(model, {3, 1}, opt, a);
  REQUIRE(out.size() == 11);
  // The same draws from full forwards of the last <= 4 tokens.
  model.eval();
  NoGradGuard no_grad;
  Rng b(17), unused(0);
  std::vector<int32_t> seq{3, 1};
  while (seq.size() < out.size()) {
    const int64_t T = std::min<int64_t>(4, static_cast<int64_t>(seq.size()));
    const Tensor l = model.forward(IndexTensor({1, T}, std::vector<int32_t>(seq.end() - T, seq.end())), unused).value();
    seq.push_back(sample_token(l.data() + (T - 1) * 7, 7, opt, b));
  }
  CHECK(out == seq);
}

TEST_CASE("generate: deterministic for a seed, crops to the block size, validates options") {
  Rng init(3);
  TransformerLM model(tiny_config(), init);
  SampleOptions opt;
  opt.tokens = 10;
  Rng a(9), b(9);
  const auto s1 = generate(model, {1, 2}, opt, a), s2 = generate(model, {1, 2}, opt, b);
  CHECK(s1 == s2);
  CHECK(s1.size() == 12);
  CHECK(model.is_training());  // mode restored
  opt.top_p = 0;
  CHECK_THROWS_WITH_AS(generate(model, {1}, opt, a), "sample: top-p must be in (0, 1], got 0", Error);
  opt.top_p = 1;
  CHECK_THROWS_WITH_AS(generate(model, {9}, opt, a), "sample: prompt token 9 is outside the vocabulary of 7", Error);
  CHECK_THROWS_WITH_AS(generate(model, {}, opt, a), doctest::Contains("prompt is empty"), Error);
  // Weights holding NaN: an error, and the model is back in training mode.
  model.named_parameters().front().second.value().data()[0] = std::nanf("");
  CHECK_THROWS_WITH_AS(generate(model, {1}, opt, a), doctest::Contains("the weights hold NaN or inf values"), Error);
  CHECK(model.is_training());
}

// The next token a model with memories picks greedily, read as training reads
// it: whole segments of block_size through forward(ids, memory), the
// unfinished last one after a copy of the memories.
static int32_t greedy_with_memories(const TransformerLM& model, const std::vector<int32_t>& seq) {
  const int64_t S = model.config().block_size, n = static_cast<int64_t>(seq.size());
  const int64_t V = model.config().vocab_size, ext = model.memory_use().ext_len;
  SegmentMemory memory;
  Tensor logits;
  for (int64_t start = 0; start < n; start += S) {
    const int64_t again = std::min(ext, start), end = std::min(n, start + S);
    SegmentMemory copy = memory;
    ModelContext ctx;
    ctx.memory = end - start == S ? &memory : &copy;
    logits = model.forward(IndexTensor({1, end - start + again}, std::vector<int32_t>(seq.begin() + start - again,
                                                                                      seq.begin() + end)),
                           ctx).value();  // (1, again + len, V)
  }
  const Scalar* last = logits.data() + (logits.dim(1) - 1) * V;
  return static_cast<int32_t>(std::max_element(last, last + V) - last);
}

TEST_CASE("generate: a model with memories samples as it trained, learned positions or relative") {
  for (const char* positional : {"learned", "txl"}) {
    for (int64_t ext_len : {0, 2}) {
      if (ext_len > 0 && std::string(positional) == "learned") continue;  // re-fed tokens pass the table's end
      CAPTURE(positional);
      CAPTURE(ext_len);
      ModelConfig c = tiny_config();
      c.vocab_size = 11;
      c.block_size = 6;
      c.n_layer = 2;
      c.n_head = 2;
      c.positional = positional;
      c.options["mem_len"] = int64_t{4};
      c.options["ext_len"] = ext_len;
      Rng rng(3);
      TransformerLM model(c, rng);
      for (auto& [name, p] : model.named_parameters()) rng.fill_normal(p.value(), 0.0f, 0.5f);  // decisive logits
      model.eval();
      SampleOptions greedy;
      greedy.temperature = 0;
      greedy.tokens = 20;  // past three segments: the learned table restarts, the memories carry
      Rng draw(0);
      const std::vector<int32_t> prompt{1, 4, 2, 8, 5, 7, 3};  // longer than a segment
      const std::vector<int32_t> out = generate(model, prompt, greedy, draw);
      NoGradGuard no_grad;
      std::vector<int32_t> expected = prompt;
      while (expected.size() < out.size()) expected.push_back(greedy_with_memories(model, expected));
      CHECK(out == expected);
      // --context does not apply: the whole text is read.
      greedy.context = 3;
      CHECK_THROWS_WITH_AS(generate(model, prompt, greedy, draw), doctest::Contains("does not apply to a model with memories"),
                           Error);
    }
  }
}
