#include "tapeformer/train/export.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <cmath>
#include <set>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/config.h"

namespace tapeformer {
namespace {

// nanoGPT's GPT: the transformer kind, standard stack and MLP, softmax attention, a learned position table.
// (Kind-specific options of other kinds keep their defaults: the config check refuses anything else.)
}  // namespace

bool is_gpt2_shaped(const LanguageModel& model) {
  const ModelConfig& c = model.config();
  return c.arch == "transformer" && c.block == "standard" && c.attention == "softmax" && c.positional == "learned" &&
         c.mlp == "standard" && !model.memory_use().carried();
}

namespace {

// tapeformer name -> (nanoGPT name, a Linear weight?).
std::pair<std::string, bool> nanogpt_name_linear(const std::string& name) {
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

// tapeformer name -> (nanoGPT name, transposed in the file?) for a GPT's
// parameters. nanoGPT's Linear weights are [out, in]; transformers' GPT-2
// keeps [in, out] (Conv1D) but for lm_head, a Linear.
std::pair<std::string, bool> nanogpt_name(const std::string& name, SafetensorsLayout layout) {
  const auto [file_name, linear] = nanogpt_name_linear(name);
  return {file_name, linear && (layout == SafetensorsLayout::native || file_name == "lm_head.weight")};
}

Tensor transposed(const Tensor& t) { return t.transpose(0, 1).contiguous(); }

std::vector<int64_t> dims(const Shape& s) {
  std::vector<int64_t> d;
  for (int i = 0; i < s.rank(); ++i) d.push_back(s[i]);
  return d;
}

// The tensors the file holds for this model: (file name, value in the file's layout).
std::vector<std::pair<std::string, Tensor>> file_tensors(const LanguageModel& model, SafetensorsLayout layout) {
  std::vector<std::pair<std::string, Tensor>> out;
  const bool gpt = is_gpt2_shaped(model), hf = layout == SafetensorsLayout::hugging_face;
  TAPEFORMER_CHECK(gpt || !hf, "export: the Hugging Face layout is GPT-2's, and this model is not (",
                   model.config().arch, ", block ", model.config().block, ", attention ", model.config().attention,
                   ", positional ", model.config().positional, ", mlp ", model.config().mlp, ")");
  Tensor wte;  // the token embedding, for the tied head
  for (const auto& [name, var] : model.named_parameters()) {
    if (name == "tok_emb.weight") wte = var.value();
    if (!gpt) {
      out.emplace_back(name, var.value().contiguous());
      continue;
    }
    const auto [file_name, transpose] = nanogpt_name(name, layout);
    out.emplace_back(file_name, transpose ? transposed(var.value()) : var.value().contiguous());
  }
  if (gpt && !hf && model.config().tie_weights)  // nanoGPT's state_dict lists the tied head too
    out.emplace_back("lm_head.weight", wte.contiguous());
  return out;
}

}  // namespace

void export_safetensors(const LanguageModel& model, const std::string& path, SafetensorsLayout layout) {
  const auto tensors = file_tensors(model, layout);
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

namespace {

// One tensor's entry in a safetensors header.
struct Entry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // its bytes in the data section
  const char* data = nullptr;   // the data section of the file it is in
  std::string path;             // that file, for errors
};

// The header's JSON; a tensor name given twice is refused (JSON would keep
// the last one and load the wrong weights).
nlohmann::json parse_header(const std::string& text, const std::string& path) {
  std::set<std::string> names;
  try {
    return nlohmann::json::parse(text, [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      TAPEFORMER_CHECK(depth <= 8, "safetensors '", path, "': the header is nested deeper than 8 levels");
      if (event == nlohmann::json::parse_event_t::key && depth == 1)
        TAPEFORMER_CHECK(names.insert(parsed.get<std::string>()).second, "safetensors '", path, "': tensor '",
                         parsed.get<std::string>(), "' appears twice in the header");
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    fail("safetensors '", path, "': the header is not JSON (", json_error_text(e.what()), ")");
  }
}

// Every tensor entry of the header, checked: its fields, and byte ranges
// that tile the data section exactly (no overlap, no gap, nothing after).
std::map<std::string, Entry> header_entries(const nlohmann::json& header, uint64_t data_bytes, const std::string& path) {
  TAPEFORMER_CHECK(header.is_object(), "safetensors '", path, "': the header is not a JSON object");
  std::map<std::string, Entry> entries;
  std::vector<const Entry*> by_offset;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    Entry x;
    x.name = name;
    try {
      x.dtype = e.at("dtype").get<std::string>();
      x.shape = e.at("shape").get<std::vector<int64_t>>();
      const auto offsets = e.at("data_offsets").get<std::vector<uint64_t>>();
      TAPEFORMER_CHECK(offsets.size() == 2, "safetensors '", path, "': tensor '", name, "' has ", offsets.size(),
                       " data_offsets, not 2");
      x.begin = offsets[0], x.end = offsets[1];
    } catch (const nlohmann::json::exception& err) {
      fail("safetensors '", path, "': tensor '", name, "': a malformed header entry (", json_error_text(err.what()), ")");
    }
    TAPEFORMER_CHECK(x.begin <= x.end && x.end <= data_bytes, "safetensors '", path, "': tensor '", name,
                     "' lies outside the file (bytes ", x.begin, " to ", x.end, " of ", data_bytes, "; truncated?)");
    by_offset.push_back(&entries.emplace(name, std::move(x)).first->second);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return a->begin != b->begin ? a->begin < b->begin : a->end < b->end; });
  uint64_t at = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : by_offset) {
    TAPEFORMER_CHECK(e->begin >= at, "safetensors '", path, "': tensors '", previous ? previous->name : "", "' and '",
                     e->name, "' overlap (bytes ", e->begin, " to ", std::min(at, e->end), ")");
    TAPEFORMER_CHECK(e->begin == at, "safetensors '", path, "': bytes ", at, " to ", e->begin,
                     " of the data belong to no tensor");
    at = e->end;
    previous = e;
  }
  TAPEFORMER_CHECK(at == data_bytes, "safetensors '", path, "': ", data_bytes - at,
                   " bytes after the last tensor belong to no tensor");
  return entries;
}

}  // namespace

namespace {

// A whole safetensors file, its entries checked (header_entries), each
// pointing into `bytes`.
struct SafetensorsFile {
  std::string bytes;
  std::map<std::string, Entry> entries;
};

std::unique_ptr<SafetensorsFile> read_safetensors(const std::string& path) {
  check_regular_file(path, "safetensors");
  std::ifstream in(path, std::ios::binary);
  TAPEFORMER_CHECK(in.good(), "safetensors '", path, "': cannot open");
  auto file = std::make_unique<SafetensorsFile>();
  std::stringstream buf;
  buf << in.rdbuf();
  file->bytes = buf.str();
  const std::string& bytes = file->bytes;
  TAPEFORMER_CHECK(bytes.size() >= 8, "safetensors '", path, "': ", bytes.size(), " bytes, too short for a header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  TAPEFORMER_CHECK(n <= bytes.size() - 8, "safetensors '", path, "': a header of ", n, " bytes in a file of ",
                   bytes.size());
  const size_t data = 8 + n;
  file->entries = header_entries(parse_header(bytes.substr(8, n), path), bytes.size() - data, path);
  for (auto& [name, e] : file->entries) {
    e.data = bytes.data() + data;
    e.path = path;
  }
  return file;
}

// The weights of `entries` (from one file or several shards) into the model.
void load_entries(LanguageModel& model, const std::map<std::string, Entry>& entries, const std::string& path,
                  SafetensorsLayout layout) {
  std::set<std::string> used;
  const auto read = [&](const std::string& name, const Shape& want) {
    const auto it = entries.find(name);
    TAPEFORMER_CHECK(it != entries.end(), "safetensors '", path, "': no tensor '", name, "'");
    const Entry& e = it->second;
    used.insert(name);
    TAPEFORMER_CHECK(e.dtype == "F32", "safetensors '", e.path, "': tensor '", name, "' is ", e.dtype, ", not F32");
    TAPEFORMER_CHECK(e.shape == dims(want), "safetensors '", e.path, "': tensor '", name, "' has shape ",
                     nlohmann::json(e.shape).dump(), " but the model expects ", want);
    TAPEFORMER_CHECK(e.end - e.begin == static_cast<uint64_t>(want.numel()) * 4, "safetensors '", e.path, "': tensor '",
                     name, "' holds ", e.end - e.begin, " bytes for its ", want.numel(), " floats");
    Tensor t = Tensor::empty(want);
    std::memcpy(t.data(), e.data + e.begin, static_cast<size_t>(want.numel()) * sizeof(float));
    const Scalar* v = t.data();
    for (int64_t i = 0; i < t.numel(); ++i)
      TAPEFORMER_CHECK(std::isfinite(v[i]), "safetensors '", e.path, "': tensor '", name,
                       "' holds a NaN or an infinity at element ", i, " (weights must be finite)");
    return t;
  };
  const bool gpt = is_gpt2_shaped(model), hf = layout == SafetensorsLayout::hugging_face;
  TAPEFORMER_CHECK(gpt || !hf, "safetensors '", path, "': a Hugging Face GPT-2 file, but the model is not GPT-2's "
                   "architecture (", model.config().block, " blocks, ", model.config().attention, " attention, ",
                   model.config().positional, " positions)");
  // GPT2Model's files name the body without "transformer.".
  const bool bare = hf && entries.count("transformer.wte.weight") == 0 && entries.count("wte.weight") != 0;
  const auto in_file = [&](const std::string& name) {
    return bare && name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
  };
  NamedTensors state;
  for (const auto& [name, var] : model.named_parameters()) {
    if (!gpt) {
      state.emplace_back(name, read(name, var.shape()));
      continue;
    }
    const auto [file_name, transpose] = nanogpt_name(name, layout);
    const Shape& s = var.shape();
    state.emplace_back(name, transpose ? transposed(read(in_file(file_name), Shape({s[1], s[0]}))) : read(in_file(file_name), s));
  }
  // nanoGPT's state_dict lists a tied head too: it must be the embedding, bit for bit.
  const auto head = entries.find("lm_head.weight"), wte = entries.find(in_file("transformer.wte.weight"));
  if (gpt && model.config().tie_weights && head != entries.end() && wte != entries.end()) {
    used.insert(head->first);
    const Entry &h = head->second, &w = wte->second;
    // The lengths first: the head's byte range is not checked against its shape, and the comparison reads w's length.
    TAPEFORMER_CHECK(h.shape == w.shape && h.dtype == w.dtype && h.end - h.begin == w.end - w.begin &&
                         std::memcmp(h.data + h.begin, w.data + w.begin, static_cast<size_t>(w.end - w.begin)) == 0,
                     "safetensors '", path, "': lm_head.weight differs from transformer.wte.weight, but this model "
                     "ties them (model.tie_weights): the file is of an untied model");
  }
  for (const auto& [name, e] : entries) {
    // nanoGPT without flash attention saves its causal mask as a buffer,
    // transformer.h.N.attn.bias (1, 1, T, T): not a weight, nothing to load.
    const auto ends = [&](const std::string& tail) {
      return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    const bool in_block = name.rfind(in_file("transformer.h."), 0) == 0;
    const bool mask = gpt && in_block && ((e.shape.size() == 4 && ends(".attn.bias")) || (hf && ends(".attn.masked_bias")));
    TAPEFORMER_CHECK(mask || used.count(name) != 0, "safetensors '", e.path, "': tensor '", name,
                     "' is not a parameter of this model (a file of another model or config?)");
  }
  for (auto& b : model.named_buffers()) state.push_back(b);
  model.load_state(state);
}

}  // namespace

void import_safetensors(LanguageModel& model, const std::string& path, SafetensorsLayout layout) {
  const auto file = read_safetensors(path);  // every entry checked before anything is loaded
  load_entries(model, file->entries, path, layout);
}

void import_safetensors_shards(LanguageModel& model, const std::string& index_path, SafetensorsLayout layout) {
  const auto text = read_regular_file(index_path, "safetensors index", size_t{64} << 20);
  TAPEFORMER_CHECK(text.has_value(), "safetensors index '", index_path, "' cannot be read: ", std::strerror(errno));
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    fail("safetensors index '", index_path, "' is not JSON (", json_error_text(e.what()), ")");
  }
  TAPEFORMER_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
                   "safetensors index '", index_path, "': no \"weight_map\" object");
  // Shards are files beside the index, named plainly: never a path elsewhere.
  const std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
  std::map<std::string, std::string> shard_of;  // tensor -> shard file name
  for (const auto& [name, file] : index["weight_map"].items()) {
    TAPEFORMER_CHECK(file.is_string(), "safetensors index '", index_path, "': the shard of '", name, "' is not a string");
    const std::string f = file.get<std::string>();
    TAPEFORMER_CHECK(!f.empty() && f.size() <= 255 && f.find('/') == std::string::npos && f.find('\\') == std::string::npos &&
                         f != "." && f != "..",
                     "safetensors index '", index_path, "': shard '", f, "' of '", name,
                     "' is not a file name in the index's directory");
    shard_of[name] = f;
  }
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards;
  for (const auto& [name, f] : shard_of)
    if (!shards.count(f)) shards[f] = read_safetensors((dir / f).string());
  std::map<std::string, Entry> entries;
  for (const auto& [f, shard] : shards) {
    for (const auto& [name, e] : shard->entries) {
      const auto listed = shard_of.find(name);
      TAPEFORMER_CHECK(listed != shard_of.end() && listed->second == f, "safetensors shard '", (dir / f).string(),
                       "' holds '", name, "', which the index ",
                       listed == shard_of.end() ? std::string("does not list") : "puts in '" + listed->second + "'");
      entries.emplace(name, e);
    }
  }
  for (const auto& [name, f] : shard_of)
    TAPEFORMER_CHECK(entries.count(name), "safetensors index '", index_path, "' puts '", name, "' in '", f,
                     "', which does not hold it");
  load_entries(model, entries, index_path, layout);
}

}  // namespace tapeformer
