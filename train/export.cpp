#include "tapeformer/train/export.h"

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/train/checkpoint.h"

namespace tapeformer {
namespace {

// nanoGPT's GPT: the transformer kind, standard stack and MLP, softmax attention, a learned position table.
// (Kind-specific options of other kinds keep their defaults: the config check refuses anything else.)
bool is_nanogpt(const LanguageModel& model) {
  const ModelConfig& c = model.config();
  return c.arch == "transformer" && c.block == "standard" && c.attention == "softmax" && c.positional == "learned" &&
         c.mlp == "standard" && model.mem_len() == 0;
}

// tapeformer name -> (nanoGPT name, transposed?) for a GPT's parameters.
std::pair<std::string, bool> nanogpt_name(const std::string& name) {
  static const std::map<std::string, std::pair<std::string, bool>> whole = {
      {"tok_emb.weight", {"transformer.wte.weight", false}},
      {"pos_emb.weight", {"transformer.wpe.weight", false}},
      {"ln_f.weight", {"transformer.ln_f.weight", false}},
      {"ln_f.bias", {"transformer.ln_f.bias", false}},
      {"lm_head.weight", {"lm_head.weight", true}}};
  if (const auto it = whole.find(name); it != whole.end()) return it->second;
  static const std::map<std::string, std::pair<std::string, bool>> in_block = {
      {"ln_1.weight", {"ln_1.weight", false}},         {"ln_1.bias", {"ln_1.bias", false}},
      {"attn.qkv.weight", {"attn.c_attn.weight", true}}, {"attn.qkv.bias", {"attn.c_attn.bias", false}},
      {"attn.proj.weight", {"attn.c_proj.weight", true}}, {"attn.proj.bias", {"attn.c_proj.bias", false}},
      {"ln_2.weight", {"ln_2.weight", false}},         {"ln_2.bias", {"ln_2.bias", false}},
      {"mlp.fc.weight", {"mlp.c_fc.weight", true}},     {"mlp.fc.bias", {"mlp.c_fc.bias", false}},
      {"mlp.proj.weight", {"mlp.c_proj.weight", true}}, {"mlp.proj.bias", {"mlp.c_proj.bias", false}}};
  const size_t dot = name.find('.');
  if (dot != std::string::npos) {
    const auto it = in_block.find(name.substr(dot + 1));
    if (it != in_block.end()) return {"transformer.h." + name.substr(0, dot) + "." + it->second.first, it->second.second};
  }
  fail("export: no nanoGPT name for parameter '", name, "'");
}

Tensor transposed(const Tensor& t) { return t.transpose(0, 1).contiguous(); }

std::vector<int64_t> dims(const Shape& s) {
  std::vector<int64_t> d;
  for (int i = 0; i < s.rank(); ++i) d.push_back(s[i]);
  return d;
}

// The tensors the file holds for this model: (file name, value in the file's layout).
std::vector<std::pair<std::string, Tensor>> file_tensors(const LanguageModel& model) {
  std::vector<std::pair<std::string, Tensor>> out;
  const bool gpt = is_nanogpt(model);
  Tensor wte;  // the token embedding, for the tied head
  for (const auto& [name, var] : model.named_parameters()) {
    if (name == "tok_emb.weight") wte = var.value();
    if (!gpt) {
      out.emplace_back(name, var.value().contiguous());
      continue;
    }
    const auto [file_name, transpose] = nanogpt_name(name);
    out.emplace_back(file_name, transpose ? transposed(var.value()) : var.value().contiguous());
  }
  if (gpt && model.config().tie_weights)  // nanoGPT's state_dict lists the tied head too
    out.emplace_back("lm_head.weight", wte.contiguous());
  return out;
}

}  // namespace

void export_safetensors(const LanguageModel& model, const std::string& path) {
  const auto tensors = file_tensors(model);
  nlohmann::json header;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const size_t bytes = static_cast<size_t>(t.numel()) * sizeof(float);
    header[name] = {{"dtype", "F32"}, {"shape", dims(t.shape())}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  nlohmann::json config = nlohmann::json::object();
  const ModelConfig& c = model.config();
  config["n_layer"] = c.n_layer, config["n_head"] = c.n_head, config["n_embd"] = c.n_embd;
  config["block_size"] = c.block_size, config["vocab_size"] = c.vocab_size, config["bias"] = c.bias;
  config["attention"] = c.attention, config["positional"] = c.positional, config["block"] = c.block;
  header["__metadata__"] = {{"format", "pt"}, {"producer", "tapeformer"}, {"tapeformer_config", config.dump()}};
  std::string head = header.dump();
  head.resize((head.size() + 7) / 8 * 8, ' ');  // the data starts 8-aligned
  std::string bytes(8, '\0');
  const uint64_t n = head.size();
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  bytes += head;
  for (const auto& [name, t] : tensors)
    bytes.append(reinterpret_cast<const char*>(t.data()), static_cast<size_t>(t.numel()) * sizeof(float));
  write_file_atomic(path, bytes);
}

void import_safetensors(LanguageModel& model, const std::string& path) {
  check_regular_file(path, "safetensors");
  std::ifstream in(path, std::ios::binary);
  TAPEFORMER_CHECK(in.good(), "safetensors '", path, "': cannot open");
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string bytes = buf.str();
  TAPEFORMER_CHECK(bytes.size() >= 8, "safetensors '", path, "': ", bytes.size(), " bytes, too short for a header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  TAPEFORMER_CHECK(n <= bytes.size() - 8, "safetensors '", path, "': a header of ", n, " bytes in a file of ",
                   bytes.size());
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, n));
  } catch (const std::exception& e) {
    fail("safetensors '", path, "': the header is not JSON (", e.what(), ")");
  }
  const size_t data = 8 + n;
  try {
    for (const auto& [name, e] : header.items()) {  // every tensor inside the file, before anything is loaded
      if (name == "__metadata__") continue;
      const auto offsets = e.at("data_offsets").get<std::vector<uint64_t>>();
      TAPEFORMER_CHECK(offsets.size() == 2 && offsets[0] <= offsets[1] && data + offsets[1] <= bytes.size(),
                       "safetensors '", path, "': tensor '", name, "' lies outside the file (truncated?)");
      e.at("shape").get<std::vector<int64_t>>();
      e.at("dtype").get<std::string>();
    }
  } catch (const nlohmann::json::exception& e) {
    fail("safetensors '", path, "': a malformed header entry (", e.what(), ")");
  }
  const auto read = [&](const std::string& name, const Shape& want) {
    TAPEFORMER_CHECK(header.contains(name), "safetensors '", path, "': no tensor '", name, "'");
    const auto& e = header[name];
    TAPEFORMER_CHECK(e.value("dtype", "") == "F32", "safetensors '", path, "': tensor '", name, "' is ",
                     e.value("dtype", "?"), ", not F32");
    const std::vector<int64_t> shape = e.at("shape").get<std::vector<int64_t>>();
    TAPEFORMER_CHECK(shape == dims(want), "safetensors '", path, "': tensor '", name, "' has shape ",
                     nlohmann::json(shape).dump(), " but the model expects ", want);
    const auto offsets = e.at("data_offsets").get<std::vector<uint64_t>>();  // inside the file: checked above
    TAPEFORMER_CHECK(offsets[1] - offsets[0] == static_cast<uint64_t>(want.numel()) * 4, "safetensors '", path,
                     "': tensor '", name, "' holds ", offsets[1] - offsets[0], " bytes for its ", want.numel(),
                     " floats");
    Tensor t = Tensor::empty(want);
    std::memcpy(t.data(), bytes.data() + data + offsets[0], static_cast<size_t>(want.numel()) * sizeof(float));
    return t;
  };
  const bool gpt = is_nanogpt(model);
  NamedTensors state;
  Tensor wte;  // the token embedding, for the tied head
  for (const auto& [name, var] : model.named_parameters()) {
    if (name == "tok_emb.weight") wte = var.value();
    if (!gpt) {
      state.emplace_back(name, read(name, var.shape()));
      continue;
    }
    const auto [file_name, transpose] = nanogpt_name(name);
    const Shape& s = var.shape();
    state.emplace_back(name, transpose ? transposed(read(file_name, Shape({s[1], s[0]}))) : read(file_name, s));
  }
  for (auto& b : model.named_buffers()) state.push_back(b);
  model.load_state(state);
}

}  // namespace tapeformer
