// Hugging Face GPT-2 directories (train/hf_gpt2.h) against transformers:
// two random GPT-2s saved by fixtures/make_hf_gpt2.py, imported, give the
// logits transformers computed (reference.json) to 1e-5 and its loss; the
// directory written back reads again to the same bits; and every refusal
// names the file and the field.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/data/byte_bpe.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/hf_gpt2.h"
#include "tapeformer/train/load_model.h"
#include "temp_dir.h"

using namespace tapeformer;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = fs::path(TAPEFORMER_FIXTURE_DIR) / "hf_gpt2";

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// The largest |ours - transformers'| over the reference's ids, and the loss.
std::pair<double, double> against_reference(const LanguageModel& model, const nlohmann::json& ref) {
  const auto rows = ref["ids"].get<std::vector<std::vector<int32_t>>>();
  const int64_t B = static_cast<int64_t>(rows.size()), T = static_cast<int64_t>(rows[0].size());
  std::vector<int32_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  const Var logits = model.forward(IndexTensor({B, T}, flat), ModelContext{});
  const auto expected = ref["logits"].get<std::vector<std::vector<std::vector<double>>>>();
  const int64_t V = logits.dim(2);
  REQUIRE(static_cast<int64_t>(expected[0][0].size()) == V);
  double worst = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t v = 0; v < V; ++v)
        worst = std::max(worst, std::abs(logits.value().at({b, t, v}) - expected[b][t][v]));
  // transformers' loss: position t predicts ids[t + 1].
  std::vector<int32_t> targets;
  for (const auto& r : rows)
    for (int64_t t = 0; t < T; ++t) targets.push_back(t + 1 < T ? r[t + 1] : -100);
  const double loss = cross_entropy(logits, IndexTensor({B, T}, targets)).item();
  return {worst, std::abs(loss - ref["loss"].get<double>())};
}

// Writes `from`'s tensors into two shards beside an index, as
// save_pretrained(max_shard_size=...) does; `edit` may change the index.
void shard(const fs::path& from, const fs::path& dir, const std::function<void(nlohmann::json&)>& edit = {}) {
  std::ifstream in(from, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  const std::string names[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  nlohmann::json heads[2], index = {{"metadata", {}}, {"weight_map", nlohmann::json::object()}};
  std::string data[2];
  size_t k = 0;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    const size_t s = k++ % 2;  // alternate the tensors between the shards
    const auto off = e["data_offsets"].get<std::vector<uint64_t>>();
    heads[s][name] = {{"dtype", e["dtype"]}, {"shape", e["shape"]}, {"data_offsets", {data[s].size(), data[s].size() + off[1] - off[0]}}};
    data[s] += bytes.substr(8 + n + off[0], off[1] - off[0]);
    index["weight_map"][name] = names[s];
  }
  for (int s = 0; s < 2; ++s) {
    const std::string h = heads[s].dump();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
    std::ofstream(dir / names[s], std::ios::binary) << out << h << data[s];
  }
  if (edit) edit(index);
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
}

}  // namespace

TEST_CASE("import-hf: a sharded checkpoint reads through its index, to the same weights") {
  TempDir dir("hf-shards");
  const auto sharded = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const fs::path d = dir.path / name;
    fs::create_directories(d);
    for (const auto& e : fs::directory_iterator(kDir / "small_a"))
      if (e.path().filename() != "model.safetensors") fs::copy_file(e.path(), d / e.path().filename());
    shard(kDir / "small_a" / "model.safetensors", d, edit);
    return d.string();
  };
  const HfGpt2 whole = read_hf_gpt2((kDir / "small_a").string());
  const HfGpt2 parts = read_hf_gpt2(sharded("ok", {}));
  const auto a = whole.model->state(), b = parts.model->state();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].second.to_vector() == b[i].second.to_vector());
  const auto refused = [](const std::string& d, const std::string& expected) {
    CHECK_THROWS_WITH_AS(read_hf_gpt2(d), doctest::Contains(expected.c_str()), Error);
  };
  refused(sharded("escape", [](auto& index) { index["weight_map"]["transformer.wte.weight"] = "../model.safetensors"; }),
          "is not a file name in the index's directory");
  refused(sharded("unlisted", [](auto& index) { index["weight_map"].erase("transformer.wpe.weight"); }),
          "which the index does not list");
  refused(sharded("moved", [](auto& index) {
            auto& m = index["weight_map"];
            m["transformer.wpe.weight"] = m["transformer.wpe.weight"] == "model-00001-of-00002.safetensors"
                                              ? "model-00002-of-00002.safetensors"
                                              : "model-00001-of-00002.safetensors";
          }),
          "which the index puts in");
}

TEST_CASE("import-hf: logits and loss equal transformers' for two GPT-2 shapes") {
  NoGradGuard no_grad;
  for (const char* name : {"small_a", "small_b"}) {
    CAPTURE(name);
    const HfGpt2 hf = read_hf_gpt2((kDir / name).string());
    const auto [worst, loss_error] = against_reference(*hf.model, read_json(kDir / name / "reference.json"));
    CHECK(worst <= 1e-5);
    CHECK(loss_error <= 1e-5);
    MESSAGE(std::string(name), ": largest logit difference from transformers ", worst);
  }
}

TEST_CASE("import-hf: layer_norm_epsilon is read (small_b's 1e-6 read as 1e-5 misses the reference)") {
  NoGradGuard no_grad;
  TempDir dir("hf-eps");
  fs::copy(kDir / "small_b", dir.path / "b");
  auto config = read_json(dir.path / "b" / "config.json");
  REQUIRE(config["layer_norm_epsilon"].get<double>() == 1e-6);
  config["layer_norm_epsilon"] = 1e-5;
  std::ofstream(dir.path / "b" / "config.json") << config.dump();
  const HfGpt2 hf = read_hf_gpt2((dir.path / "b").string());
  CHECK(against_reference(*hf.model, read_json(kDir / "small_b" / "reference.json")).first > 1e-5);
}

TEST_CASE("import-hf: the run it writes, exported back, reads to the same bits") {
  NoGradGuard no_grad;
  TempDir dir("hf-roundtrip");
  const HfGpt2 hf = read_hf_gpt2((kDir / "small_b").string());
  write_imported_run(hf, (dir.path / "run").string());
  const Loaded run = load_model((dir.path / "run").string());
  CHECK(run.cfg.model.norm_eps == 1e-6f);
  CHECK(run.tokenizer->kind() == "byte_bpe");
  write_hf_gpt2(*run.model, *run.tokenizer, (dir.path / "hf").string());
  const HfGpt2 again = read_hf_gpt2((dir.path / "hf").string());
  const auto a = hf.model->state(), b = again.model->state();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(a[i].first);
    CHECK(a[i].first == b[i].first);
    CHECK(a[i].second.to_vector() == b[i].second.to_vector());
  }
  const auto config = read_json(dir.path / "hf" / "config.json");
  const auto original = read_json(kDir / "small_b" / "config.json");
  for (const char* key : {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size", "activation_function",
                          "layer_norm_epsilon", "tie_word_embeddings"}) {
    CAPTURE(key);
    CHECK(config[key] == original[key]);
  }
  const std::string text = "Hello, world! It's 3:14.";
  CHECK(again.tokenizer->encode(text) == hf.tokenizer->encode(text));
  CHECK_THROWS_WITH_AS(write_imported_run(hf, (dir.path / "run").string()), doctest::Contains("already holds a checkpoint"),
                       Error);
}

TEST_CASE("import-hf: --block-size cuts the position table, and the logits stay transformers'") {
  NoGradGuard no_grad;
  const HfGpt2 full = read_hf_gpt2((kDir / "small_a").string());
  const HfGpt2 cut = read_hf_gpt2((kDir / "small_a").string(), 16);
  CHECK(cut.cfg.model.block_size == 16);
  // The reference's 12 positions fit in 16: the same logits as the whole table's.
  const auto ref = read_json(kDir / "small_a" / "reference.json");
  CHECK(against_reference(*cut.model, ref).first == against_reference(*full.model, ref).first);
  CHECK_THROWS_WITH_AS(read_hf_gpt2((kDir / "small_a").string(), 65), doctest::Contains("only cut the table"), Error);
}

TEST_CASE("import-hf: refusals name the file and the field") {
  TempDir dir("hf-refusals");
  const auto copy_of = [&](const std::string& name) {
    const fs::path to = dir.path / name;
    fs::create_directories(to);
    for (const auto& e : fs::directory_iterator(kDir / "small_a")) fs::copy_file(e.path(), to / e.path().filename());
    return to;
  };
  const auto with_config = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const fs::path d = copy_of(name);
    auto config = read_json(d / "config.json");
    edit(config);
    std::ofstream(d / "config.json") << config.dump();
    return d.string();
  };
  const auto refused = [](const std::string& d, const std::string& expected) {
    try {
      read_hf_gpt2(d);
      FAIL("accepted ", d);
    } catch (const Error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.find(expected) != std::string::npos);
    }
  };
  refused(with_config("llama", [](auto& c) { c["model_type"] = "llama"; }), "model_type is \"llama\"");
  refused(with_config("erf", [](auto& c) { c["activation_function"] = "gelu"; }), "the erf form");
  refused(with_config("inner", [](auto& c) { c["n_inner"] = 100; }), "n_inner = 100");
  refused(with_config("wide", [](auto& c) { c["n_embd"] = 64; }), "model.safetensors");  // shapes disagree
  refused(with_config("vocab", [](auto& c) { c["vocab_size"] = 401; }), "the tokenizer has 400 tokens");
  const fs::path pickle = copy_of("pickle");
  fs::remove(pickle / "model.safetensors");
  std::ofstream(pickle / "pytorch_model.bin") << "not read";
  refused(pickle.string(), "only pytorch_model.bin");
  const fs::path sharded = copy_of("sharded");
  fs::rename(sharded / "model.safetensors", sharded / "model-00001-of-00002.safetensors");
  refused(sharded.string(), "but no model.safetensors.index.json");
  std::ofstream(sharded / "model.safetensors.index.json") << "{}";
  refused(sharded.string(), "no \"weight_map\"");
  const fs::path truncated = copy_of("truncated");
  fs::resize_file(truncated / "model.safetensors", 1000);
  refused(truncated.string(), "model.safetensors");
  refused((dir.path / "missing").string(), "is not a directory");
}
