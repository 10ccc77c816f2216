// safetensors export and import: a round trip gives the same logits bit for
// bit (nanoGPT's names for a GPT, tapeformer's for other architectures), the
// file is readable as the format says, and damaged or mismatched files are
// refused naming the tensor.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tapeformer/core/error.h"
#include "temp_dir.h"
#include "tapeformer/train/export.h"

using namespace tapeformer;

namespace {

ModelConfig small(const std::string& positional, bool tie = true) {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.positional = positional;
  c.tie_weights = tie;
  return c;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

nlohmann::json header_of(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  return nlohmann::json::parse(bytes.substr(8, n));
}

Tensor logits(const TransformerLM& m) {
  NoGradGuard no_grad;
  Rng unused(0);
  return m.forward(IndexTensor({1, 8}, {1, 2, 3, 4, 5, 6, 7, 8}), unused).value();
}

}  // namespace

TEST_CASE("safetensors: export then import gives the same logits (GPT with nanoGPT's names, and rope)") {
  TempDir dir("export");
  for (const auto& [positional, tie] : {std::pair<std::string, bool>{"learned", true}, {"learned", false}, {"rope", true}}) {
    CAPTURE(positional);
    CAPTURE(tie);
    Rng a(1), b(2);
    TransformerLM source(small(positional, tie), a), target(small(positional, tie), b);
    source.eval();
    target.eval();
    const std::string path = (dir.path / "m.safetensors").string();
    export_safetensors(source, path);
    REQUIRE(logits(target).to_vector() != logits(source).to_vector());
    import_safetensors(target, path);
    CHECK(logits(target).to_vector() == logits(source).to_vector());
    const nlohmann::json h = header_of(read_file(path));
    if (positional == "learned") {  // nanoGPT's GPT: its names, PyTorch's [out, in] Linear weights
      CHECK(h.at("transformer.h.1.attn.c_attn.weight").at("shape") == nlohmann::json({48, 16}));
      CHECK(h.at("transformer.wpe.weight").at("shape") == nlohmann::json({8, 16}));
      CHECK(h.at("lm_head.weight").at("shape") == nlohmann::json({11, 16}));
    } else {
      CHECK(h.contains("0.attn.qkv.weight"));
    }
    CHECK(h.at("__metadata__").at("producer") == "tapeformer");
  }
}

TEST_CASE("safetensors: truncated, foreign-shaped and incomplete files are refused naming the tensor") {
  TempDir dir("export-bad");
  Rng rng(3);
  TransformerLM model(small("learned"), rng);
  const std::string path = (dir.path / "m.safetensors").string();
  export_safetensors(model, path);
  const std::string bytes = read_file(path);
  const std::string cut = (dir.path / "cut.safetensors").string();
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() - 100);
  CHECK_THROWS_WITH_AS(import_safetensors(model, cut),
                       doctest::Contains("lies outside the file (truncated?)"), Error);
  ModelConfig wide = small("learned");
  wide.n_embd = 32;
  TransformerLM other(wide, rng);
  CHECK_THROWS_WITH_AS(import_safetensors(other, path),
                       doctest::Contains("tensor 'transformer.wte.weight' has shape [11,16] but the model expects [11, 32]"),
                       Error);
  TransformerLM rope(small("rope"), rng);
  CHECK_THROWS_WITH_AS(import_safetensors(rope, path), doctest::Contains("no tensor 'tok_emb.weight'"), Error);
  CHECK_THROWS_WITH_AS(import_safetensors(model, (dir.path / "none").string()), doctest::Contains("cannot open"),
                       Error);
}
