// Every block kind x attention kind x positional scheme (x feature map) the
// registries allow, as whole models: causality, inference states against the full
// forward, gradients, parameter counts from the kinds, and the combinations
// the config refuses (with the keys named).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/core/error.h"
#include "golden.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/linear.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/transformer.h"
#include "tapeformer/train/sample.h"

using namespace tapeformer;

namespace {

struct Arch {
  std::string attention, positional, feature_map;
  std::string block = "standard";
  std::string label() const {
    return attention + (feature_map.empty() ? "" : "(" + feature_map + ")") + " + " + positional +
           (block == "standard" ? "" : " [" + block + "]");
  }
};

ModelConfig config_of(const Arch& a, int64_t layers = 2, int64_t width = 16, int64_t block = 12) {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = block;
  c.n_layer = layers;
  c.n_head = 2;
  c.n_embd = width;
  c.attention = a.attention;
  c.positional = a.positional;
  c.block = a.block;
  if (!a.feature_map.empty()) c.options["feature_map"] = a.feature_map;
  // The kinds' own small values (ModelOption::small): a window of 3 and
  // Shaw's clip of 3 over 12 tokens, so every query misses some earlier
  // keys and offsets beyond the clip share a vector (the masks and the
  // clipping run, not just causality).
  const auto small = [&](const std::vector<ModelOption>& options) {
    for (const ModelOption& o : options)
      if (o.small) c.options[o.name] = *o.small;
  };
  if (const AttentionKind* kind = attention_kinds().find(a.attention)) small(kind->options);
  if (const PositionalKind* kind = positional_kinds().find(a.positional)) small(kind->options);
  return c;
}

// Every combination the kinds accept; the refused ones are tested below.
std::vector<Arch> allowed() {
  std::vector<Arch> out;
  for (const BlockKind& block : block_kinds().kinds())
    for (const AttentionKind& attn : attention_kinds().kinds())
      for (const PositionalKind& pos : positional_kinds().kinds()) {
        std::vector<std::string> maps{""};
        if (attn.name == "linear") {  // every feature map in the table
          maps.clear();
          for (const FeatureMapKind& m : feature_map_kinds().kinds()) maps.push_back(m.name);
        }
        for (const std::string& map : maps) {
          const Arch a{attn.name, pos.name, map, block.name};
          try {
            config_of(a).validate_kinds();
            out.push_back(a);
          } catch (const Error&) {
          }
        }
      }
  return out;
}

IndexTensor random_ids(int64_t B, int64_t T, int32_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(B * T));
  for (auto& x : v) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  return IndexTensor({B, T}, v);
}

// A model with weights large enough that every position matters.
std::unique_ptr<TransformerLM> random_model(const ModelConfig& c, uint64_t seed) {
  Rng rng(seed);
  auto model = std::make_unique<TransformerLM>(c, rng);
  for (auto& [name, p] : model->named_parameters()) rng.fill_normal(p.value(), 0.0f, 0.3f);
  model->eval();
  return model;
}

IndexTensor columns(const IndexTensor& ids, int64_t t0, int64_t t1) {
  const int64_t B = ids.shape[0], T = ids.shape[1];
  std::vector<int32_t> v;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = t0; t < t1; ++t) v.push_back(ids.data[static_cast<size_t>(b * T + t)]);
  return IndexTensor({B, t1 - t0}, v);
}

}  // namespace

TEST_CASE("the registries allow the expected combinations") {
  std::vector<std::string> labels;
  for (const Arch& a : allowed()) labels.push_back(a.label());
  for (const char* want : {"softmax + learned", "softmax + sinusoidal", "softmax + rope", "softmax + alibi",
                           "softmax + shaw", "linear(elu1) + learned", "linear(elu1) + rope", "linear(cos) + rope",
                           "linear(efficient) + sinusoidal", "softmax + rope [reversible]",
                           "linear(elu1) + rope [reversible]"})
    CHECK_MESSAGE(std::count(labels.begin(), labels.end(), want) == 1, want);
  for (const char* refused : {"linear(elu1) + alibi", "linear(elu1) + shaw", "linear(efficient) + rope"})
    CHECK_MESSAGE(std::count(labels.begin(), labels.end(), refused) == 0, refused);
}

TEST_CASE("causality probe: changing token t leaves every output before t bit-identical (every combination)") {
  for (const Arch& a : allowed()) {
    if (attention_kinds().get(a.attention).causality == Causality::chunk_dependent) continue;  // LSH: tests/layers/test_lsh.cpp
    CAPTURE(a.label());
    const ModelConfig c = config_of(a);
    const auto model = random_model(c, 1);
    NoGradGuard no_grad;
    Rng unused(0);
    IndexTensor ids = random_ids(2, c.block_size, 11, 2);
    const Tensor before = model->forward(ids, unused).value();  // (B, T, V)
    const int64_t t = 7;
    for (int64_t b = 0; b < 2; ++b) {
      int32_t& id = ids.data[static_cast<size_t>(b * c.block_size + t)];
      id = (id + 1) % 11;
    }
    const Tensor after = model->forward(ids, unused).value();
    CHECK(after.slice(1, 0, t).to_vector() == before.slice(1, 0, t).to_vector());
    CHECK(after.slice(1, t, t + 1).to_vector() != before.slice(1, t, t + 1).to_vector());  // the probe can fail
  }
}

TEST_CASE("inference states (KV cache, running sums) equal the full forward, piece by piece (every combination)") {
  for (const Arch& a : allowed()) {
    if (attention_kinds().get(a.attention).causality == Causality::chunk_dependent) continue;  // LSH: tests/layers/test_lsh.cpp
    CAPTURE(a.label());
    const ModelConfig c = config_of(a);
    const auto model = random_model(c, 3);
    NoGradGuard no_grad;
    Rng unused(0);
    const IndexTensor ids = random_ids(2, c.block_size, 11, 4);
    const Tensor full = model->forward(ids, unused).value();  // (B, T, V)
    auto state = model->make_state(2);
    if (a.attention == "softmax") {  // from an empty cache the same kernels run: the same bits
      CHECK(model->forward(ids, *state).value().to_vector() == full.to_vector());
      state->reset();
    }
    for (const auto& [t0, t1] : {std::pair<int64_t, int64_t>{0, 3}, {3, 4}, {4, 5}, {5, 9}, {9, 12}}) {
      const int64_t from = t0;
      CAPTURE(from);
      const Tensor got = model->forward(columns(ids, t0, t1), *state).value();
      // RFA: the chunked scan (matrix products) and the one-step recurrence sum in other orders, and
      // a random model's denominators d_t = phi(q_t) . z_t come near 0, which multiplies that
      // rounding (1.4e-5 seen with sinusoidal positions); a wrong state is off by O(0.1).
      check_close(got, full.slice(1, t0, t1), a.label(), a.attention == "rfa" ? 1e-4 : 1e-5);
    }
    CHECK(state->length() == c.block_size);
  }
}

TEST_CASE("a sliding KV cache with relative positions attends to exactly the last `window` keys") {
  // One layer: the cached keys depend on their own token only, so token t
  // read through a window of 4 equals the last row of a forward of tokens t-3..t.
  for (const char* scheme : {"rope", "alibi", "shaw"}) {
    CAPTURE(scheme);
    const ModelConfig c = config_of({"softmax", scheme, ""}, /*layers=*/1);
    const auto model = random_model(c, 5);
    NoGradGuard no_grad;
    Rng unused(0);
    const IndexTensor ids = random_ids(1, c.block_size, 11, 6);
    auto state = model->make_state(1, /*window=*/4);
    for (int64_t t = 0; t < c.block_size; ++t) {
      const Tensor got = model->forward(columns(ids, t, t + 1), *state).value();  // (1, 1, V)
      const int64_t t0 = std::max<int64_t>(0, t - 3);
      const Tensor window = model->forward(columns(ids, t0, t + 1), unused).value();
      check_close(got, window.slice(1, t - t0, t - t0 + 1), "position " + std::to_string(t), 1e-5);
    }
  }
}

TEST_CASE("schemes without a table sample and evaluate past the block size; learned positions refuse") {
  for (const Arch& a : {Arch{"softmax", "rope", ""}, Arch{"softmax", "alibi", ""}, Arch{"linear", "rope", "elu1"},
                        Arch{"linear", "sinusoidal", "cos"}}) {
    CAPTURE(a.label());
    const ModelConfig c = config_of(a, 2, 16, /*block=*/8);
    const auto model = random_model(c, 7);
    SampleOptions opt;
    opt.tokens = 20;
    opt.temperature = 0;  // greedy: comparable with argmax of full forwards
    opt.context = 40;     // more than the text: every layer sees everything
    Rng rng(0);
    const std::vector<int32_t> prompt = {1, 2, 3};
    const std::vector<int32_t> seq = generate(*model, prompt, opt, rng);
    REQUIRE(seq.size() == 23);
    // The same tokens as greedy decoding with a full forward of the whole text each step.
    NoGradGuard no_grad;
    Rng unused(0);
    std::vector<int32_t> greedy = prompt;
    while (greedy.size() < seq.size()) {
      const auto T = static_cast<int64_t>(greedy.size());
      const Tensor logits = model->forward(IndexTensor({1, T}, greedy), unused).value();  // (1, T, V)
      const Scalar* row = logits.data() + (T - 1) * 11;
      greedy.push_back(static_cast<int32_t>(std::max_element(row, row + 11) - row));
    }
    CHECK(seq == greedy);
  }
  const auto learned = random_model(config_of({"softmax", "learned", ""}, 2, 16, 8), 8);
  SampleOptions opt;
  opt.context = 9;
  Rng rng(0);
  CHECK_THROWS_WITH_AS(generate(*learned, {1}, opt, rng),
                       "sample: context 9 exceeds the 8 positions of model.positional \"learned\" (its table ends at "
                       "model.block_size); a positional scheme without a table takes any context",
                       Error);
}

TEST_CASE("gradients of whole models check against finite differences (every combination)") {
  for (const Arch& a : allowed()) {
    // GTrXL's ReLU on branch outputs puts kinks where finite differences
    // fail at random weights; its new parts (the gates, gru_gate) gradcheck
    // on their own in tests/layers/test_blocks.cpp and test_gradcheck_ops.
    if (a.block == "gtrxl") continue;
    CAPTURE(a.label());
    ModelConfig c = config_of(a, /*layers=*/1, /*width=*/8, /*block=*/5);
    c.vocab_size = 7;
    Rng rng(9);
    TransformerLM model(c, rng);
    for (auto& [name, p] : model.named_parameters()) rng.fill_normal(p.value(), 0.0f, 0.5f);
    // LSH attention draws fresh hash rotations from the Rng in training, by design; its math is checked
    // with eval's fixed rotations (the same buckets at every evaluation of the finite differences).
    if (attention_kinds().get(a.attention).causality == Causality::chunk_dependent) model.eval();
    const IndexTensor x = random_ids(2, 5, 7, 10), y = random_ids(2, 5, 7, 11);
    Rng unused(0);
    GradcheckOptions opt;
    opt.label = a.label();
    const GradcheckResult r =
        gradcheck_vars([&] { return cross_entropy(model.forward(x, unused), y); }, model.parameters(), opt);
    CHECK_MESSAGE(r.ok, r.message);
  }
}

TEST_CASE("parameter counts come from the kinds and equal the built model's") {
  for (const Arch& a : allowed())
    for (bool bias : {true, false})
      for (bool tie : {true, false}) {
        CAPTURE(a.label());
        CAPTURE(bias);
        CAPTURE(tie);
        ModelConfig c = config_of(a);
        c.bias = bias;
        c.tie_weights = tie;
        Rng rng(12);
        CHECK(TransformerLM::footprint(c).parameters == static_cast<double>(TransformerLM(c, rng).num_parameters()));
      }
}

TEST_CASE("combinations the math does not allow are refused, naming the keys") {
  const auto refused = [](Arch a, const std::string& message, std::map<std::string, OptionValue> extra = {}) {
    ModelConfig c = config_of(a);
    for (auto& [k, v] : extra) c.options[k] = v;
    CHECK_THROWS_WITH_AS(c.validate_kinds(), message.c_str(), Error);
  };
  refused({"linear", "alibi", "elu1"},
          "model.positional \"alibi\" does not combine with model.attention \"linear\": it adds constant terms to the "
          "T x T attention scores, which linear attention never forms (schemes that combine with it: learned, "
          "sinusoidal, rope)");
  refused({"linear", "shaw", "cos"},
          "model.positional \"shaw\" does not combine with model.attention \"linear\": it adds learned terms per "
          "(query, key) pair to the scores and values, which linear attention never forms (schemes that combine "
          "with it: learned, sinusoidal, rope)");
  refused({"linear", "rope", "efficient"},
          "model.positional \"rope\" does not combine with model.feature_map \"efficient\": rotating q and k inside "
          "its two softmaxes is not a rotation of a kernel's features (use elu1 or cos with it)");
  refused({"softmax", "learned", "cos"},
          "model.feature_map = \"cos\" applies to model.attention \"linear\" only; this config selects "
          "model.attention \"softmax\", model.positional \"learned\", model.block \"standard\" and model.mlp \"standard\"");
  refused({"softmax", "rope", ""},
          "model.rel_clip = 8 applies to model.positional \"shaw\" only; this config selects model.attention "
          "\"softmax\", model.positional \"rope\", model.block \"standard\" and model.mlp \"standard\"",
          {{"rel_clip", int64_t{8}}});
  refused({"linear", "learned", "relu1"},
          "model.feature_map: unknown kind \"relu1\" (known: " + feature_map_kinds().names() + ")");
  refused({"softmax", "shaw", ""}, "model.rel_clip must be in [1, 2^20], got 0", {{"rel_clip", int64_t{0}}});
  refused({"softmax", "shaw", ""}, "model.rel_clip must be an integer, got \"8\"", {{"rel_clip", std::string("8")}});
  refused({"softmax", "learned", ""}, "model.widow: no registered kind declares this option",
          {{"widow", int64_t{3}}});
  refused({"softmax", "learned", ""},
          "model.window = 3 applies to model.attention \"window\" or model.attention \"longformer\" or model.attention "
          "\"bigbird\" only; this config selects model.attention \"softmax\", model.positional \"learned\", "
          "model.block \"standard\" and model.mlp \"standard\"",
          {{"window", int64_t{3}}});
  // The known kinds are the registries' (a new kind changes no test).
  refused({"flash", "learned", ""}, "model.attention: unknown kind \"flash\" (known: " + attention_kinds().names() + ")");
  refused({"softmax", "xpos", ""}, "model.positional: unknown kind \"xpos\" (known: " + positional_kinds().names() + ")");
  // Setting an option to its default with another kind is harmless.
  ModelConfig c = config_of({"softmax", "learned", "elu1"});
  CHECK_NOTHROW(c.validate_kinds());
}

TEST_CASE("a program registers its own positional scheme without editing the library") {
  // A scheme that adds nothing, registered at run time, is selectable by name.
  if (positional_kinds().find("none") == nullptr) {
    PositionalKind none;
    none.name = "none";
    none.summary = "no positions at all (a bag of tokens with a causal mask)";
    none.make = [](const ModelConfig&, Rng&) { return std::make_shared<Positional>(); };
    none.parameters = [](const ModelConfig&) { return 0.0; };
    none.check = [](const ModelConfig&) {};
    positional_kinds().add(none);
  }
  const ModelConfig c = config_of({"linear", "none", "elu1"});
  Rng rng(13);
  TransformerLM model(c, rng);
  CHECK(model.max_positions() == -1);
  CHECK(TransformerLM::footprint(c).parameters == static_cast<double>(model.num_parameters()));
  CHECK_THROWS_WITH_AS(positional_kinds().add(positional_kinds().get("rope")),
                       "model.positional: a kind named \"rope\" is already registered", Error);
}

TEST_CASE("feature maps are a table: a program's phi runs linear attention like a built-in map") {
  // The same phi as elu1 under another name: the same model, bit for bit, in training and generation.
  if (feature_map_kinds().find("elu1_again") == nullptr)
    feature_map_kinds().add({"elu1_again", "elu(x) + 1, registered by a test", LinearAttention::FeatureMap::Features,
                             [](const Var& x) { return add_scalar(elu(x), 1.0f); }, nullptr});
  const auto logits = [](const std::string& map) {
    ModelConfig c = config_of({"linear", "rope", map, "standard"});
    const auto model = random_model(c, 91);
    const IndexTensor ids = random_ids(2, 12, 11, 92);
    Rng unused(0);
    NoGradGuard no_grad;
    const Tensor whole = model->forward(ids, unused).value();
    auto state = model->make_state(2);
    const Tensor first = model->forward(columns(ids, 0, 5), *state).value();
    return std::make_pair(whole.to_vector(), first.to_vector());
  };
  CHECK(logits("elu1_again") == logits("elu1"));
}
