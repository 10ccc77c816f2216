#include "tapeformer/train/hf_gpt2.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/data/byte_bpe.h"
#include "tapeformer/data/utf8.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/export.h"

namespace tapeformer {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr size_t kMaxConfigBytes = size_t{1} << 20;

std::string read_small(const fs::path& path, const std::string& what) {
  const auto text = read_regular_file(path.string(), what, kMaxConfigBytes);
  TAPEFORMER_CHECK(text.has_value(), what, " '", path.string(), "' cannot be read: ", std::strerror(errno));
  return *text;
}

int64_t positive_int(const json& doc, const char* key, const std::string& origin, int64_t most) {
  const auto it = doc.find(key);
  TAPEFORMER_CHECK(it != doc.end() && it->is_number_integer(), origin, ": \"", key, "\" must be an integer");
  const int64_t v = it->get<int64_t>();
  TAPEFORMER_CHECK(v >= 1 && v <= most, origin, ": \"", key, "\" = ", v, " is outside 1..", most);
  return v;
}

// A number field, or `fallback` when absent or null.
double number_or(const json& doc, const char* key, double fallback, const std::string& origin) {
  const auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) return fallback;
  TAPEFORMER_CHECK(it->is_number(), origin, ": \"", key, "\" must be a number");
  return it->get<double>();
}

bool bool_or(const json& doc, const char* key, bool fallback, const std::string& origin) {
  const auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) return fallback;
  TAPEFORMER_CHECK(it->is_boolean(), origin, ": \"", key, "\" must be true or false");
  return it->get<bool>();
}

// The id of GPT-2's end-of-text token in this tokenizer, or null when it has none.
json end_of_text(const Tokenizer* tokenizer) {
  if (const auto* bpe = dynamic_cast<const ByteBpeTokenizer*>(tokenizer))
    for (const auto& [id, text] : bpe->model().added)
      if (text == "<|endoftext|>") return id;
  return nullptr;
}

// A char vocabulary as tokenizers' WordLevel model: the text split into
// single characters ("(?m)." is Oniguruma's dot-matches-newline), each its
// own id (the same ids: code points in sorted order), joined back by Fuse.
std::string char_tokenizer_json(const CharTokenizer& tok) {
  json vocab = json::object();
  for (size_t id = 0; id < tok.vocab().size(); ++id) {
    std::string c;
    utf8_append(c, tok.vocab()[id]);
    vocab[c] = id;
  }
  const json doc = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(?m)."}}}, {"behavior", "Isolated"}, {"invert", false}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "Fuse"}}},
      {"model", {{"type", "WordLevel"}, {"vocab", vocab}, {"unk_token", "\xEF\xBF\xBD"}}},
  };
  return doc.dump(-1, ' ', false, json::error_handler_t::strict);
}

}  // namespace

ModelConfig model_config_of_hf(const std::string& config_json, const std::string& origin) {
  json doc;
  try {
    doc = json::parse(config_json);
  } catch (const json::parse_error& e) {
    fail(origin, " is not JSON: ", e.what());
  }
  TAPEFORMER_CHECK(doc.is_object(), origin, ": the top level is not an object");
  const std::string type = doc.value("model_type", std::string());
  TAPEFORMER_CHECK(type == "gpt2", origin, ": model_type is \"", type,
                   "\"; import-hf reads GPT-2 checkpoints (model_type \"gpt2\") only");
  ModelConfig m;
  m.n_layer = positive_int(doc, "n_layer", origin, 1024);
  m.n_head = positive_int(doc, "n_head", origin, 1024);
  m.n_embd = positive_int(doc, "n_embd", origin, 65536);
  m.vocab_size = positive_int(doc, "vocab_size", origin, 65536);
  m.block_size = positive_int(doc, doc.contains("n_positions") ? "n_positions" : "n_ctx", origin, 1 << 20);
  TAPEFORMER_CHECK(m.n_embd % m.n_head == 0, origin, ": n_embd = ", m.n_embd, " is not a multiple of n_head = ", m.n_head);
  const double eps = number_or(doc, "layer_norm_epsilon", 1e-5, origin);
  TAPEFORMER_CHECK(eps > 0 && eps <= 0.1, origin, ": layer_norm_epsilon = ", eps, " is outside (0, 0.1]");
  m.norm_eps = static_cast<float>(eps);
  const double dropout = number_or(doc, "resid_pdrop", 0.1, origin);
  TAPEFORMER_CHECK(dropout >= 0 && dropout < 1, origin, ": resid_pdrop = ", dropout, " is outside [0, 1)");
  m.dropout = static_cast<float>(dropout);
  const std::string act = doc.value("activation_function", std::string("gelu_new"));
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") m.activation = "gelu";
  else if (act == "relu") m.activation = "relu";
  else if (act == "silu" || act == "swish") m.activation = "silu";
  else fail(origin, ": activation_function \"", act, "\" is not one tapeformer has (gelu_new or gelu_pytorch_tanh, "
            "GPT-2's tanh GELU; relu; silu)", act == "gelu" ? ": \"gelu\" is the erf form, which differs from the tanh "
            "form by up to 1e-3" : "");
  const auto inner = doc.find("n_inner");
  TAPEFORMER_CHECK(inner == doc.end() || inner->is_null() || (inner->is_number_integer() && inner->get<int64_t>() == 4 * m.n_embd),
                   origin, ": n_inner = ", inner == doc.end() ? std::string() : inner->dump(),
                   "; tapeformer's MLP is 4 n_embd = ", 4 * m.n_embd, " wide");
  TAPEFORMER_CHECK(bool_or(doc, "scale_attn_weights", true, origin), origin,
                   ": scale_attn_weights is false; tapeformer's attention scales scores by 1/sqrt(head size)");
  TAPEFORMER_CHECK(!bool_or(doc, "scale_attn_by_inverse_layer_idx", false, origin), origin,
                   ": scale_attn_by_inverse_layer_idx is true, which tapeformer's attention does not do");
  TAPEFORMER_CHECK(!bool_or(doc, "add_cross_attention", false, origin), origin,
                   ": add_cross_attention is true: an encoder-decoder GPT-2, which import-hf does not read");
  m.tie_weights = bool_or(doc, "tie_word_embeddings", true, origin);
  m.bias = true;
  m.arch = "transformer";
  m.block = "standard";
  m.attention = "softmax";
  m.positional = "learned";
  m.mlp = "standard";
  return m;
}

std::string hf_config_of_model(const LanguageModel& model, const Tokenizer* tokenizer) {
  const ModelConfig& m = model.config();
  TAPEFORMER_CHECK(is_gpt2_shaped(model), "export --format hf: GPT-2 is the transformer kind with standard blocks and "
                   "MLP, softmax attention, learned positions and no memories; this model has model.arch \"", m.arch,
                   "\", model.block \"", m.block, "\", model.attention \"", m.attention, "\", model.positional \"",
                   m.positional, "\", model.mlp \"", m.mlp, "\"", model.memory_use().carried() ? " and a memory" : "");
  TAPEFORMER_CHECK(m.bias, "export --format hf: model.bias is false, but every GPT-2 layer has biases");
  TAPEFORMER_CHECK(m.causal, "export --format hf: GPT-2 is causal; this model is not");
  std::string act;
  if (m.activation == "gelu") act = "gelu_new";
  else if (m.activation == "relu" || m.activation == "silu") act = m.activation;
  else fail("export --format hf: model.activation \"", m.activation, "\" has no GPT-2 counterpart");
  const json eot = end_of_text(tokenizer);
  char eps_text[32];
  std::snprintf(eps_text, sizeof eps_text, "%.7g", static_cast<double>(m.norm_eps));
  const double eps = std::stod(eps_text);  // the float's shortest decimal: 1e-05, not 9.99999974738e-06
  const json doc = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", m.vocab_size},
      {"n_positions", m.block_size},
      {"n_embd", m.n_embd},
      {"n_layer", m.n_layer},
      {"n_head", m.n_head},
      {"n_inner", nullptr},
      {"activation_function", act},
      {"resid_pdrop", m.dropout},
      {"embd_pdrop", m.dropout},
      {"attn_pdrop", m.dropout},
      {"layer_norm_epsilon", eps},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", m.tie_weights},
      {"bos_token_id", eot},
      {"eos_token_id", eot},
      {"use_cache", true},
      {"torch_dtype", "float32"},
  };
  return doc.dump(2) + "\n";
}

HfGpt2 read_hf_gpt2(const std::string& dir, int64_t block_size) {
  std::error_code ec;
  const fs::path p(dir);
  TAPEFORMER_CHECK(fs::is_directory(p, ec), "import-hf: '", dir, "' is not a directory (give the directory "
                   "save_pretrained wrote: config.json, model.safetensors and the tokenizer files)");
  const fs::path config = p / "config.json", weights = p / "model.safetensors";
  TAPEFORMER_CHECK(fs::exists(config, ec), "import-hf: '", dir, "' has no config.json");
  const fs::path index = p / "model.safetensors.index.json";
  const bool sharded = !fs::exists(weights, ec) && fs::exists(index, ec);
  if (!fs::exists(weights, ec) && !sharded) {
    bool shards = false;
    for (const auto& e : fs::directory_iterator(p, ec))
      shards = shards || (e.path().extension() == ".safetensors" && e.path().filename().string().rfind("model-", 0) == 0);
    TAPEFORMER_CHECK(!shards, "import-hf: '", dir, "' holds safetensors shards (model-*.safetensors) but no "
                     "model.safetensors.index.json, which says which tensor each holds");
    const bool pickle = fs::exists(p / "pytorch_model.bin", ec);
    fail("import-hf: '", dir, "' has no model.safetensors", pickle ? " (only pytorch_model.bin, a Python pickle, which "
         "can run code when it is read and which tapeformer does not read); convert it with transformers: "
         "GPT2LMHeadModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)" : "");
  }
  HfGpt2 hf;
  hf.cfg.model = model_config_of_hf(read_small(config, "config.json"), "import-hf: '" + config.string() + "'");
  hf.tokenizer = ByteBpeTokenizer::read(dir);
  TAPEFORMER_CHECK(hf.tokenizer->vocab_size() == hf.cfg.model.vocab_size, "import-hf: '", dir, "': the tokenizer has ",
                   hf.tokenizer->vocab_size(), " tokens but config.json's vocab_size is ", hf.cfg.model.vocab_size,
                   " (tapeformer's embedding has one row per token)");
  hf.cfg.data.tokenizer = "byte_bpe";
  hf.cfg.data.tokenizer_path = fs::absolute(p, ec).lexically_normal().string();
  hf.cfg.validate();
  Rng init(0);
  hf.model = make_model(hf.cfg.model, init);
  if (sharded) import_safetensors_shards(*hf.model, index.string(), SafetensorsLayout::hugging_face);
  else import_safetensors(*hf.model, weights.string(), SafetensorsLayout::hugging_face);
  if (block_size > 0 && block_size != hf.cfg.model.block_size) {
    TAPEFORMER_CHECK(block_size < hf.cfg.model.block_size, "import-hf: --block-size ", block_size, " is beyond the ",
                     hf.cfg.model.block_size, " positions config.json gives (n_positions); it can only cut the table");
    NamedTensors state = hf.model->state();
    for (auto& [name, t] : state)
      if (name == "pos_emb.weight") t = t.slice(0, 0, block_size).contiguous();  // (block_size, C)
    hf.cfg.model.block_size = block_size;
    hf.model = make_model(hf.cfg.model, init);
    hf.model->load_state(state);
  }
  hf.model->eval();
  return hf;
}

void write_imported_run(const HfGpt2& hf, const std::string& out_dir) {
  std::error_code ec;
  const fs::path ckpt = fs::path(out_dir) / "checkpoint.bin";
  TAPEFORMER_CHECK(!fs::exists(ckpt, ec), "import-hf: '", out_dir, "' already holds a checkpoint; choose another --out");
  fs::create_directories(out_dir, ec);
  TAPEFORMER_CHECK(!ec, "import-hf: cannot create '", out_dir, "': ", ec.message());
  Checkpoint c;
  c.config_json = hf.cfg.to_json();
  c.tokenizer = save_tokenizer(*hf.tokenizer);
  c.model = hf.model->state();
  c.step = 0;  // no optimizer state: `train --resume` starts the optimizer, sampler and draws afresh
  save_checkpoint(ckpt.string(), c);
}

void write_hf_gpt2(const LanguageModel& model, const Tokenizer& tokenizer, const std::string& dir) {
  const std::string config = hf_config_of_model(model, &tokenizer);
  const auto* bpe = dynamic_cast<const ByteBpeTokenizer*>(&tokenizer);
  const auto* chars = dynamic_cast<const CharTokenizer*>(&tokenizer);
  TAPEFORMER_CHECK(bpe != nullptr || chars != nullptr, "export --format hf: the run's tokenizer is \"", tokenizer.kind(),
                   "\"; transformers reads a byte-level BPE (data.tokenizer \"byte_bpe\") or a char vocabulary, "
                   "not this one");
  std::error_code ec;
  fs::create_directories(dir, ec);
  TAPEFORMER_CHECK(!ec, "export: cannot create '", dir, "': ", ec.message());
  const fs::path p(dir);
  const json eot = end_of_text(&tokenizer);
  write_file_atomic((p / "config.json").string(), config);
  write_file_atomic((p / "generation_config.json").string(),
                    json({{"bos_token_id", eot}, {"eos_token_id", eot}}).dump(2) + "\n");
  export_safetensors(model, (p / "model.safetensors").string(), SafetensorsLayout::hugging_face);
  if (chars != nullptr) {
    write_file_atomic((p / "tokenizer.json").string(), char_tokenizer_json(*chars));
    const json tokenizer_config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                   {"model_max_length", model.config().block_size}};
    write_file_atomic((p / "tokenizer_config.json").string(), tokenizer_config.dump(2) + "\n");
    return;
  }
  const std::string eot_text = eot.is_null() ? std::string() : bpe->model().tokens[eot.get<size_t>()];
  write_file_atomic((p / "vocab.json").string(), bpe->vocab_json());
  write_file_atomic((p / "merges.txt").string(), bpe->merges_txt());
  write_file_atomic((p / "tokenizer.json").string(), bpe->tokenizer_json());
  const json special = eot.is_null() ? json::object()
                                     : json{{"bos_token", eot_text}, {"eos_token", eot_text}, {"unk_token", eot_text}};
  write_file_atomic((p / "special_tokens_map.json").string(), special.dump(2) + "\n");
  json tokenizer_config = special;
  tokenizer_config["tokenizer_class"] = "GPT2Tokenizer";
  tokenizer_config["add_prefix_space"] = bpe->model().add_prefix_space;
  tokenizer_config["model_max_length"] = model.config().block_size;
  write_file_atomic((p / "tokenizer_config.json").string(), tokenizer_config.dump(2) + "\n");
}

}  // namespace tapeformer
