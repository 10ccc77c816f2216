#include "tapeformer/layers/model_config.h"

#include <cmath>
#include <sstream>

#include "tapeformer/core/error.h"
#include "tapeformer/layers/activations.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/basic.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/layers/mlp.h"
#include "tapeformer/layers/positional/positional.h"

namespace tapeformer {

float residual_init_std(const ModelConfig& cfg) {
  return kInitStd / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
}

std::string option_to_string(const OptionValue& v) {
  std::ostringstream out;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) out << '"' << x << '"';
        else if constexpr (std::is_same_v<T, bool>) out << (x ? "true" : "false");
        else out << x;
      },
      v);
  return out.str();
}

namespace {
const char* const kTypeNames[] = {"true or false", "an integer", "a number", "a string"};  // by variant index
}  // namespace

const char* option_type_name(const OptionValue& v) { return kTypeNames[v.index()]; }

std::vector<DeclaredOption> model_options() {
  std::vector<DeclaredOption> out;
  const auto take = [&](const std::vector<ModelOption>& options, const std::string& reader) {
    for (const ModelOption& o : options) {
      DeclaredOption* same = nullptr;
      for (DeclaredOption& d : out)
        if (d.option.name == o.name) same = &d;
      if (same == nullptr) {
        out.push_back({o, {reader}});
        continue;
      }
      TAPEFORMER_CHECK(same->option.default_value == o.default_value, "model.", o.name, " is declared by ",
                       same->readers.front(), " with default ", option_to_string(same->option.default_value),
                       " and by ", reader, " with default ", option_to_string(o.default_value));
      same->readers.push_back(reader);
    }
  };
  for (const AttentionKind& k : attention_kinds().kinds()) take(k.options, "model.attention \"" + k.name + "\"");
  for (const PositionalKind& k : positional_kinds().kinds()) take(k.options, "model.positional \"" + k.name + "\"");
  for (const BlockKind& k : block_kinds().kinds()) take(k.options, "model.block \"" + k.name + "\"");
  std::string carriers;  // the block kinds a memory's keys apply to
  for (const BlockKind& k : block_kinds().kinds())
    if (k.memory) carriers += (carriers.empty() ? "model.block \"" : ", \"") + k.name + "\"";
  for (const MemoryKind& k : memory_kinds().kinds()) take(k.options, "memory \"" + k.name + "\" (of " + carriers + ")");
  for (const MlpKind& k : mlp_kinds().kinds()) take(k.options, "model.mlp \"" + k.name + "\"");
  for (const ModelKind& k : model_kinds().kinds()) take(k.options, "model.arch \"" + k.name + "\"");
  return out;
}

namespace {

// The value of option `name`, which a kind's code reads as variant index `type`
// (a copy: the declarations are gathered afresh from the registries).
OptionValue option(const ModelConfig& cfg, const std::string& name, size_t type) {
  for (const DeclaredOption& d : model_options())
    if (d.option.name == name) return declared_value(d.option, cfg.options, "model", type);
  fail("model.", name, ": no registered kind declares this option");
}

}  // namespace

OptionValue declared_value(const ModelOption& decl, const std::map<std::string, OptionValue>& values,
                           const std::string& section, size_t type) {
  TAPEFORMER_CHECK(decl.default_value.index() == type, section, ".", decl.name, " is declared as ",
                   kTypeNames[decl.default_value.index()], " but read as ", kTypeNames[type]);
  const auto it = values.find(decl.name);
  OptionValue v = it == values.end() ? decl.default_value : it->second;
  TAPEFORMER_CHECK(v.index() == type, section, ".", decl.name, " must be ", kTypeNames[type], ", got ",
                   option_to_string(v));
  return v;
}

std::string ModelConfig::option_string(const std::string& name) const {
  return std::get<std::string>(option(*this, name, 3));
}
int64_t ModelConfig::option_int(const std::string& name) const { return std::get<int64_t>(option(*this, name, 1)); }
double ModelConfig::option_number(const std::string& name) const { return std::get<double>(option(*this, name, 2)); }
bool ModelConfig::option_bool(const std::string& name) const { return std::get<bool>(option(*this, name, 0)); }

void ModelConfig::validate() const {
  TAPEFORMER_CHECK(vocab_size > 0, "model.vocab_size must be > 0, got ", vocab_size);
  TAPEFORMER_CHECK(block_size > 0, "model.block_size must be > 0, got ", block_size);
  TAPEFORMER_CHECK(n_layer > 0, "model.n_layer must be > 0, got ", n_layer);
  TAPEFORMER_CHECK(n_head > 0, "model.n_head must be > 0, got ", n_head);
  TAPEFORMER_CHECK(n_embd > 0 && n_embd % n_head == 0, "model.n_embd (", n_embd,
                   ") must be a positive multiple of model.n_head (", n_head, ")");
  TAPEFORMER_CHECK(dropout >= 0.0f && dropout < 1.0f, "model.dropout must be in [0, 1), got ", dropout);
  validate_kinds();
}

void ModelConfig::validate_kinds() const {
  const AttentionKind& attn = attention_kinds().get(attention);
  const PositionalKind& pos = positional_kinds().get(positional);
  const BlockKind& blk = block_kinds().get(block);
  const MlpKind& ffn = mlp_kinds().get(mlp);
  const ModelKind& model = model_kinds().get(arch);
  activation_kinds().get(activation);  // Error naming model.activation and the known ones
  TAPEFORMER_CHECK(ffn.reads_activation || activation == ModelConfig().activation, "model.activation = \"",
                   activation, "\" does not apply to model.mlp \"", mlp, "\", whose activation is fixed");
  // An option only the unselected kinds read must keep its default: a value
  // set for nothing is refused, not silently ignored.
  for (const DeclaredOption& d : model_options()) {
    const auto it = options.find(d.option.name);
    if (it == options.end()) continue;
    TAPEFORMER_CHECK(it->second.index() == d.option.default_value.index(), "model.", d.option.name, " must be ",
                     option_type_name(d.option.default_value), ", got ", option_to_string(it->second));
    const auto reads = [&](const std::vector<ModelOption>& opts) {
      for (const ModelOption& o : opts)
        if (o.name == d.option.name) return true;
      return false;
    };
    bool by_memory = false;  // a memory kind's key, on a block kind that carries memories
    if (blk.memory)
      for (const MemoryKind& k : memory_kinds().kinds()) by_memory = by_memory || reads(k.options);
    if (it->second == d.option.default_value || reads(attn.options) || reads(pos.options) || reads(blk.options) ||
        reads(ffn.options) || reads(model.options) || by_memory)
      continue;
    std::string readers;
    for (const std::string& r : d.readers) readers += (readers.empty() ? "" : " or ") + r;
    fail("model.", d.option.name, " = ", option_to_string(it->second), " applies to ", readers,
         " only; this config selects model.attention \"", attention, "\", model.positional \"", positional,
         "\", model.block \"", block, "\" and model.mlp \"", mlp, "\"");
  }
  for (const auto& [name, value] : options) {
    bool declared = false;
    for (const DeclaredOption& d : model_options()) declared = declared || d.option.name == name;
    TAPEFORMER_CHECK(declared, "model.", name, ": no registered kind declares this option");
  }
  pos.check(*this);
  attn.check(*this, pos);  // a kind may explain its causality first (linformer)
  TAPEFORMER_CHECK(serves(attn.causality, causal), "model.attention \"", attention, "\" is ",
                   causality_name(attn.causality), ": it cannot serve a ", causal ? "causal" : "bidirectional",
                   " model (ModelConfig::causal = ", causal ? "true" : "false", ")");
  blk.check(*this);
  if (blk.memory)
    for (const MemoryKind& k : memory_kinds().kinds())
      if (k.check) k.check(*this);
  // A kind that is on runs in the segment recurrence, which model.mem_len
  // turns on, after the kinds it builds on: else it would be silently idle.
  for (const MemoryKind* k : memories_on(*this)) {
    const ModelOption& length = k->options.front();
    const std::string key = "model." + length.name + " = " +
                            option_to_string(declared_value(length, options, "model", length.default_value.index()));
    for (const std::string& need : k->needs)
      TAPEFORMER_CHECK(memory_kinds().get(need).on(*this), "memory \"", k->name, "\" (", key,
                       ") builds on memory \"", need, "\", which is off (set model.",
                       memory_kinds().get(need).options.front().name, " > 0)");
    TAPEFORMER_CHECK(memory_use(*this).carried(), "memory \"", k->name, "\" (", key,
                     ") is on, but nothing carries segments: memories run in the segment recurrence that model.mem_len "
                     "> 0 turns on (list \"xl\" in its MemoryKind::needs)");
  }
}

}  // namespace tapeformer
