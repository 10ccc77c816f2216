// safetensors export and import: a round trip gives the same logits bit for
// bit (nanoGPT's names for a GPT, tapeformer's for other architectures), the
// file is readable as the format says, and damaged or mismatched files are
// refused naming the tensor.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
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

// The 8-byte little-endian length of a safetensors file's header.
uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  return n;
}

nlohmann::json header_of(const std::string& bytes) { return nlohmann::json::parse(bytes.substr(8, header_length(bytes))); }

// A safetensors file of this header text and data section.
std::string safetensors_bytes(std::string head, const std::string& data) {
  head.resize((head.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((head.size() >> (8 * i)) & 0xff);
  return out + head + data;
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
  CHECK_THROWS_WITH_AS(import_safetensors(model, cut), doctest::Contains("lies outside the file (bytes"), Error);
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

TEST_CASE("safetensors: inconsistent files are refused before anything is loaded") {
  // Each of these loaded (wrong or extra) weights silently before the reader
  // checked the header as a whole.
  TempDir dir("export-hostile");
  Rng rng(4);
  TransformerLM model(small("learned"), rng);
  const std::string path = (dir.path / "m.safetensors").string();
  export_safetensors(model, path);
  const std::string bytes = read_file(path);
  const nlohmann::json header = header_of(bytes);
  const uint64_t n = header_length(bytes);
  const std::string head = bytes.substr(8, n), data = bytes.substr(8 + n);
  const auto refused = [&](const std::string& file_bytes, const std::string& message) {
    const std::string bad = (dir.path / "bad.safetensors").string();
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << file_bytes;
    Rng r(5);
    TransformerLM target(small("learned"), r);
    const std::vector<float> before = logits(target).to_vector();
    CHECK_THROWS_WITH_AS(import_safetensors(target, bad), doctest::Contains(message.c_str()), Error);
    CHECK(logits(target).to_vector() == before);  // nothing was loaded
  };
  const auto offsets = [&](const std::string& name) { return header.at(name).at("data_offsets"); };

  // The untouched file loads: every case below is one change to it.
  Rng r(6);
  TransformerLM fine(small("learned"), r);
  import_safetensors(fine, path);

  // A name given twice: JSON keeps the last, here the positions' bytes for the embedding.
  const std::string wte = header.at("transformer.wte.weight").dump();
  std::string twice = head;
  const size_t close = twice.find_last_of('}');
  twice.insert(close, ",\"transformer.wte.weight\":" + wte);
  refused(safetensors_bytes(twice, data), "tensor 'transformer.wte.weight' appears twice in the header");

  // Two tensors on the same bytes (ln_1's weight and bias are both 16 floats).
  nlohmann::json h = header;
  h["transformer.h.0.ln_1.bias"]["data_offsets"] = offsets("transformer.h.0.ln_1.weight");
  refused(safetensors_bytes(h.dump(), data), "overlap");

  // Bytes no tensor claims: after the last one, and a hole (a tensor moved up by 4 bytes past the end).
  refused(safetensors_bytes(head, data + std::string(8, '\0')), "8 bytes after the last tensor belong to no tensor");

  // A tensor the model does not have.
  h = header;
  h["extra.weight"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {data.size(), data.size() + 8}}};
  refused(safetensors_bytes(h.dump(), data + std::string(8, '\0')), "tensor 'extra.weight' is not a parameter of this model");

  // nanoGPT's causal-mask buffer (no flash attention) is not a weight: skipped, not refused.
  {
    h = header;
    const uint64_t end = data.size(), mask = 4 * 8 * 8;
    h["transformer.h.0.attn.bias"] = {{"dtype", "F32"}, {"shape", {1, 1, 8, 8}}, {"data_offsets", {end, end + mask}}};
    const std::string with_mask = (dir.path / "mask.safetensors").string();
    std::ofstream(with_mask, std::ios::binary | std::ios::trunc) << safetensors_bytes(h.dump(), data + std::string(mask, '\0'));
    Rng r3(8);
    TransformerLM target(small("learned"), r3);
    import_safetensors(target, with_mask);
    CHECK(logits(target).to_vector() == logits(fine).to_vector());
  }

  // A tied model's head that is not its embedding.
  std::string untied = data;
  untied[static_cast<size_t>(offsets("lm_head.weight")[0].get<uint64_t>())] ^= 0x01;
  refused(safetensors_bytes(head, untied), "lm_head.weight differs from transformer.wte.weight");

  // A tied head 4 bytes short (the last tensor; the data ends with it): its
  // shape says otherwise, and it is compared by length before by content.
  h = header;
  h["lm_head.weight"]["data_offsets"][1] = offsets("lm_head.weight")[1].get<uint64_t>() - 4;
  refused(safetensors_bytes(h.dump(), data.substr(0, data.size() - 4)), "lm_head.weight differs from transformer.wte.weight");

  // A NaN weight.
  std::string nan = data;
  const float q = std::nanf("");
  std::memcpy(&nan[static_cast<size_t>(offsets("transformer.h.1.mlp.c_fc.weight")[0].get<uint64_t>())], &q, 4);
  refused(safetensors_bytes(head, nan), "tensor 'transformer.h.1.mlp.c_fc.weight' holds a NaN or an infinity at element 0");

  // A header that is not JSON: the parser's words, without its exception tag.
  refused(safetensors_bytes("{\"a\": tru", data), "the header is not JSON (parse error at line 1");
  const std::string bad = (dir.path / "bad.safetensors").string();
  Rng r2(7);
  TransformerLM target(small("learned"), r2);
  try {
    import_safetensors(target, bad);
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("[json.exception") == std::string::npos);
  }
}
