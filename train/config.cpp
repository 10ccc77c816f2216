#include "tapeformer/train/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <sstream>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/data/utf8.h"
#include "tapeformer/optim/optimizer.h"

namespace tapeformer {
namespace {

using json = nlohmann::json;

// Every config field, once: (dotted key, member). Parsing, overrides, the
// unknown-key check and serialisation all walk this list.
// A kind-specific model option: its declaration and the map its value goes in.
struct OptionSlot {
  std::map<std::string, OptionValue>* values;
  ModelOption decl;
  const OptionValue& value() const {
    const auto it = values->find(decl.name);
    return it == values->end() ? decl.default_value : it->second;
  }
};

// Every option some optimizer kind declares, once; two kinds may share a
// name only with the same default.
std::vector<ModelOption> optimizer_options() {
  std::vector<ModelOption> out;
  for (const OptimizerKind& k : optimizer_kinds().kinds()) {
    for (const ModelOption& o : k.options) {
      const auto same = std::find_if(out.begin(), out.end(), [&](const ModelOption& d) { return d.name == o.name; });
      if (same == out.end()) out.push_back(o);
      else
        TAPEFORMER_CHECK(same->default_value == o.default_value, "optimizer.", o.name,
                         " is declared by two optimizer kinds with different defaults");
    }
  }
  return out;
}

template <class Cfg, class Visitor>
void visit_fields(Cfg& c, Visitor&& v) {
  v("model.n_layer", c.model.n_layer);
  v("model.n_head", c.model.n_head);
  v("model.n_embd", c.model.n_embd);
  v("model.block_size", c.model.block_size);
  v("model.dropout", c.model.dropout);
  v("model.bias", c.model.bias);
  v("model.norm_eps", c.model.norm_eps);
  v("model.tie_weights", c.model.tie_weights);
  v("model.activation", c.model.activation);
  v("model.attention", c.model.attention);
  v("model.positional", c.model.positional);
  v("model.arch", c.model.arch);
  v("model.block", c.model.block);
  v("model.mlp", c.model.mlp);
  // The kind-specific keys the registered kinds declare (model.feature_map, ...).
  for (const DeclaredOption& d : model_options()) {
    OptionSlot slot{&c.model.options, d.option};
    v("model." + d.option.name, slot);
  }
  v("data.path", c.data.path);
  v("data.tokenizer", c.data.tokenizer);
  v("data.val_fraction", c.data.val_fraction);
  v("data.vocab_size", c.data.vocab_size);
  v("data.sp_type", c.data.sp_type);
  v("data.sp_model", c.data.sp_model);
  v("data.tokenizer_path", c.data.tokenizer_path);
  v("data.align", c.data.align);
  v("train.batch_size", c.train.batch_size);
  v("train.grad_accum", c.train.grad_accum);
  v("train.max_iters", c.train.max_iters);
  v("train.seed", c.train.seed);
  v("train.threads", c.train.threads);
  v("train.shards", c.train.shards);
  v("train.precision", c.train.precision);
  v("train.recompute", c.train.recompute);
  v("optimizer.name", c.optimizer.name);
  v("optimizer.lr", c.optimizer.lr);
  v("optimizer.betas", c.optimizer.betas);
  v("optimizer.eps", c.optimizer.eps);
  v("optimizer.weight_decay", c.optimizer.weight_decay);
  v("optimizer.momentum", c.optimizer.momentum);
  v("optimizer.nesterov", c.optimizer.nesterov);
  v("optimizer.grad_clip", c.optimizer.grad_clip);
  // The keys optimizer kinds declare themselves (optimizer.lion_beta2, ...).
  for (const ModelOption& o : optimizer_options()) {
    OptionSlot slot{&c.optimizer.options, o};
    v("optimizer." + o.name, slot);
  }
  v("schedule.name", c.schedule.name);
  v("schedule.warmup_iters", c.schedule.warmup_iters);
  v("schedule.decay_iters", c.schedule.decay_iters);
  v("schedule.min_lr", c.schedule.min_lr);
  v("eval.interval", c.eval.interval);
  v("eval.iters", c.eval.iters);
  v("eval.final_iters", c.eval.final_iters);
  v("eval.mem_len", c.eval.mem_len);
  v("checkpoint.interval", c.checkpoint.interval);
  v("log.interval", c.log.interval);
}

// ---- JSON <-> field conversions, with the key named in every error ----
[[noreturn]] void type_error(const std::string& key, const char* want, const json& j) {
  fail("config: '", key, "' must be ", want, ", got ", j.dump());
}
void read(const std::string& key, const json& j, int64_t& out) {
  if (!j.is_number_integer()) type_error(key, "an integer", j);
  // An integer above INT64_MAX parses as unsigned and would wrap to a negative.
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    type_error(key, "an integer below 2^63", j);
  out = j.get<int64_t>();
}
void read(const std::string& key, const json& j, double& out) {
  if (!j.is_number()) type_error(key, "a number", j);
  out = j.get<double>();
}
void read(const std::string& key, const json& j, float& out) {
  double d;
  read(key, j, d);
  out = static_cast<float>(d);
  // A number JSON holds as a double may be beyond a float (1e39 would be inf).
  if (!std::isfinite(out)) type_error(key, "a number within a float's range (|x| < 3.4e38)", j);
}
void read(const std::string& key, const json& j, bool& out) {
  if (!j.is_boolean()) type_error(key, "true or false", j);
  out = j.get<bool>();
}
void read(const std::string& key, const json& j, std::string& out) {
  if (!j.is_string()) type_error(key, "a string", j);
  out = j.get<std::string>();
}
void read(const std::string& key, const json& j, std::array<double, 2>& out) {
  if (!j.is_array() || j.size() != 2 || !j[0].is_number() || !j[1].is_number())
    type_error(key, "an array of two numbers", j);
  out = {j[0].get<double>(), j[1].get<double>()};
}
// Reads the JSON type the option's default has.
void read(const std::string& key, const json& j, OptionSlot& out) {
  OptionValue v = out.decl.default_value;
  std::visit([&](auto& x) { read(key, j, x); }, v);
  (*out.values)[out.decl.name] = std::move(v);
}
template <class T>
json write(const T& v) { return json(v); }
json write(const OptionSlot& s) {
  return std::visit([](const auto& x) { return json(x); }, s.value());
}

// Flattens nested objects into dotted keys; arrays and scalars are leaves.
void flatten(const json& j, const std::string& prefix, std::map<std::string, json>& out,
             const std::string& origin) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.key().empty() && it.key()[0] == '_') continue;  // comment
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object()) flatten(*it, key, out, origin);
    else out[key] = *it;
  }
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

std::vector<std::string> known_keys() {
  std::vector<std::string> keys;
  TrainConfig c;
  visit_fields(c, [&](const std::string& k, auto&) { keys.push_back(k); });
  return keys;
}

// `where`: "config 'FILE'" or "--set".
[[noreturn]] void unknown_key(const std::string& key, const std::string& where) {
  std::string best;
  size_t best_d = 4;  // suggest only close matches
  for (const std::string& k : known_keys()) {
    const size_t d = edit_distance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  std::string hint;
  if (!best.empty()) hint = " (did you mean '" + best + "'?)";
  else if (key.rfind("model.", 0) == 0 || key.rfind("optimizer.", 0) == 0)
    hint = " (no registered kind declares it: a kind's own key is known only to a program that registers the kind, "
           "see docs/custom-layers.md)";
  fail(where, ": unknown key '", key, "'", hint);
}

// Nesting deeper than any config needs is refused while parsing: copying or
// printing a value nested thousands deep would recurse off the stack.
constexpr int kMaxJsonDepth = 64;

// A JSON object open while parsing: its dotted path and the keys seen in it.
struct OpenObject {
  std::string path;
  std::set<std::string> keys;
  std::string last_key;
};

// Parses JSON, refusing deep nesting and a key repeated in one object: JSON
// keeps only the last of duplicate keys, so a second "model" section would
// silently replace the first.
json parse_json(const std::string& text, const std::string& what) {
  std::vector<OpenObject> open;
  return json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
    TAPEFORMER_CHECK(depth <= kMaxJsonDepth, what, ": JSON nested deeper than ", kMaxJsonDepth, " levels");
    if (event == json::parse_event_t::object_start) {
      std::string path;
      if (!open.empty()) {
        const OpenObject& parent = open.back();
        path = parent.path.empty() ? parent.last_key : parent.path + "." + parent.last_key;
      }
      open.push_back({path, {}, {}});
    } else if (event == json::parse_event_t::object_end && !open.empty()) {
      open.pop_back();
    } else if (event == json::parse_event_t::key && !open.empty()) {
      OpenObject& o = open.back();
      o.last_key = parsed.get<std::string>();
      const std::string dotted = o.path.empty() ? o.last_key : o.path + "." + o.last_key;
      TAPEFORMER_CHECK(o.keys.insert(o.last_key).second, what, ": key '", dotted, "' appears twice");
    }
    return true;
  });
}

json parse_override_value(const std::string& key, const std::string& text) {
  try {
    return parse_json(text, "--set " + key);
  } catch (const json::exception&) {
    return json(text);  // bare words are strings: --set optimizer.name=sgd
  }
}

}  // namespace

TrainConfig TrainConfig::parse(const std::string& text, const std::string& origin,
                               const std::vector<std::string>& overrides) {
  json root;
  try {
    root = parse_json(text, "config " + origin);
  } catch (const json::exception& e) {  // syntax, and numbers beyond a double (1e400)
    fail("config ", origin, ": invalid JSON: ", json_error_text(e.what()));
  }
  TAPEFORMER_CHECK(root.is_object(), "config ", origin, ": top level must be a JSON object");
  std::map<std::string, json> flat;
  flatten(root, "", flat, origin);
  const std::vector<std::string> keys = known_keys();
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    TAPEFORMER_CHECK(eq != std::string::npos && eq > 0, "--set: expected key=value, got '", o, "'");
    const std::string key = o.substr(0, eq);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) unknown_key(key, "--set");
    const std::string value = o.substr(eq + 1);
    const size_t bad = utf8_error_offset(value);
    TAPEFORMER_CHECK(bad == std::string::npos, "--set ", key, ": value is not valid UTF-8 (bad byte ",
                     hex_byte(static_cast<unsigned char>(value[bad])), " at offset ", bad, ")");
    flat[key] = parse_override_value(key, value);
  }
  TrainConfig cfg;
  visit_fields(cfg, [&](const std::string& key, auto& field) {
    auto it = flat.find(key);
    if (it == flat.end()) return;
    read(key, it->second, field);
    flat.erase(it);
  });
  if (!flat.empty()) unknown_key(flat.begin()->first, "config " + origin);
  cfg.validate();
  return cfg;
}

namespace {

// optimizer.NAME of the selected kind, read as variant index `type`.
OptionValue optimizer_option(const OptimizerConfig& c, const std::string& name, size_t type) {
  for (const ModelOption& o : optimizer_kinds().get(c.name).options)
    if (o.name == name) return declared_value(o, c.options, "optimizer", type);
  fail("optimizer.", name, ": optimizer.name \"", c.name, "\" declares no such option");
}

}  // namespace

double OptimizerConfig::option_number(const std::string& name) const {
  return std::get<double>(optimizer_option(*this, name, 2));
}
int64_t OptimizerConfig::option_int(const std::string& name) const {
  return std::get<int64_t>(optimizer_option(*this, name, 1));
}
bool OptimizerConfig::option_bool(const std::string& name) const {
  return std::get<bool>(optimizer_option(*this, name, 0));
}
std::string OptimizerConfig::option_string(const std::string& name) const {
  return std::get<std::string>(optimizer_option(*this, name, 3));
}

TrainConfig TrainConfig::load(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  TAPEFORMER_CHECK(!std::filesystem::is_directory(path, ec), "config: '", path, "' is a directory, not a JSON file");
  check_regular_file(path, "config");
  std::ifstream in(path, std::ios::binary);
  TAPEFORMER_CHECK(in.good(), "config: cannot open '", path, "'");
  std::stringstream buf;
  buf << in.rdbuf();
  return parse(buf.str(), "'" + path + "'", overrides);
}

namespace {

// JSON text of a value; a string that is not UTF-8 (validate() refuses one,
// but a caller may skip it) is an Error naming the key, not nlohmann's.
std::string dump_field(const std::string& key, const json& j, int indent = -1) {
  try {
    return j.dump(indent);
  } catch (const json::exception& e) {
    fail("config: '", key, "' cannot be stored as JSON: ", json_error_text(e.what()));
  }
}

}  // namespace

std::string TrainConfig::to_json() const {
  json root = json::object();
  TrainConfig copy = *this;
  visit_fields(copy, [&](const std::string& key, auto& field) {
    json value = write(field);
    dump_field(key, value);
    root[json::json_pointer("/" + std::string(key).replace(key.find('.'), 1, "/"))] = std::move(value);
  });
  return root.dump(2);
}

std::vector<std::pair<std::string, std::string>> TrainConfig::fields() const {
  std::vector<std::pair<std::string, std::string>> out;
  TrainConfig copy = *this;
  visit_fields(copy, [&](const std::string& key, auto& field) { out.emplace_back(key, dump_field(key, write(field))); });
  return out;
}

void TrainConfig::validate() const {
  // Every string is stored in the checkpoint as JSON, which holds UTF-8 only:
  // refused here, not at the first checkpoint. data.path usually comes from
  // --data, a file name in any bytes.
  TrainConfig copy = *this;
  visit_fields(copy, [&](const std::string& key, auto& field) {
    const json value = write(field);
    if (!value.is_string()) return;
    const std::string& s = value.get_ref<const std::string&>();
    const size_t bad = utf8_error_offset(s);
    if (bad == std::string::npos) return;
    const bool file = key == "data.path" || key == "data.sp_model" || key == "data.tokenizer_path";
    fail("config: '", key, "' = \"", s, "\" is not valid UTF-8 (bad byte ", hex_byte(static_cast<unsigned char>(s[bad])),
         " at offset ", bad, "); a checkpoint stores it as JSON: ", file ? "rename the file" : "use UTF-8");
  });
  // Sizes and counts: at least 1, at most 2^31 - 1, so products of a few of
  // them (tokens per step, iteration arithmetic) cannot overflow.
  const auto positive = [](const char* key, int64_t v) {
    TAPEFORMER_CHECK(v > 0, "config: '", key, "' must be > 0, got ", v);
    TAPEFORMER_CHECK(v <= INT32_MAX, "config: '", key, "' must be at most ", INT32_MAX, ", got ", v);
  };
  positive("model.n_layer", model.n_layer);
  positive("model.n_head", model.n_head);
  positive("model.n_embd", model.n_embd);
  positive("model.block_size", model.block_size);
  TAPEFORMER_CHECK(model.n_embd % model.n_head == 0, "config: 'model.n_embd' (", model.n_embd,
                   ") must be a multiple of 'model.n_head' (", model.n_head, ")");
  TAPEFORMER_CHECK(model.dropout >= 0 && model.dropout < 1, "config: 'model.dropout' must be in [0, 1), got ",
                   model.dropout);
  TAPEFORMER_CHECK(model.norm_eps > 0 && model.norm_eps <= 0.1f, "config: 'model.norm_eps' must be in (0, 0.1], got ",
                   model.norm_eps);
  try {
    model.validate_kinds();  // the attention kind, the positional scheme and their options
  } catch (const Error& e) {
    fail("config: ", e.what());
  }
  try {
    const TokenizerKind& tokenizer = tokenizer_kinds().get(data.tokenizer);
    if (tokenizer.check) tokenizer.check(data.tokenizer_options());
  } catch (const Error& e) {
    fail("config: ", e.what());
  }
  TAPEFORMER_CHECK(data.align >= 1, "config: 'data.align' must be >= 1 (1: windows start anywhere), got ", data.align);
  TAPEFORMER_CHECK(data.val_fraction > 0 && data.val_fraction < 1,
                   "config: 'data.val_fraction' must be in (0, 1), got ", data.val_fraction);
  positive("train.batch_size", train.batch_size);
  positive("train.grad_accum", train.grad_accum);
  positive("train.max_iters", train.max_iters);
  TAPEFORMER_CHECK(train.max_iters <= kMaxOptimizerSteps, "config: 'train.max_iters' must be at most ",
                   kMaxOptimizerSteps, " (optimizer step counts are saved as float32), got ", train.max_iters);
  const double tokens_per_step = static_cast<double>(train.batch_size) * model.block_size * train.grad_accum;
  TAPEFORMER_CHECK(tokens_per_step <= 0x1p40, "config: 'train.batch_size' x 'model.block_size' x 'train.grad_accum' = ",
                   tokens_per_step, " tokens per step is more than 2^40");
  TAPEFORMER_CHECK(train.seed >= 0, "config: 'train.seed' must be >= 0, got ", train.seed);
  TAPEFORMER_CHECK(train.threads >= 0 && train.threads <= 1024, "config: 'train.threads' must be in [0, 1024], got ",
                   train.threads);
  TAPEFORMER_CHECK(train.shards >= 0 && train.shards <= 1024, "config: 'train.shards' must be in [0, 1024], got ",
                   train.shards);
  TAPEFORMER_CHECK(train.precision == "fp32" || train.precision == "bf16" || train.precision == "bf16_portable",
                   "config: 'train.precision' must be \"fp32\", \"bf16\" or \"bf16_portable\", got \"", train.precision,
                   "\"");
  train.recompute_every();  // refuses a value it cannot read, naming the key
  TAPEFORMER_CHECK(optimizer_kinds().find(optimizer.name) != nullptr, "config: 'optimizer.name' must be one of ",
                   optimizer_kinds().names(), ", got \"", optimizer.name, "\"");
  // An optimizer kind's own key, set for a kind this config does not select, is refused.
  for (const auto& [name, value] : optimizer.options) {
    const std::vector<ModelOption>& mine = optimizer_kinds().get(optimizer.name).options;
    const bool reads = std::any_of(mine.begin(), mine.end(), [&](const ModelOption& o) { return o.name == name; });
    bool is_default = false;
    for (const ModelOption& o : optimizer_options()) is_default = is_default || (o.name == name && o.default_value == value);
    TAPEFORMER_CHECK(reads || is_default, "config: 'optimizer.", name, "' = ", option_to_string(value),
                     " does not apply to optimizer.name \"", optimizer.name, "\"");
  }
  // Optimizers compute in float: check the values as they will be used
  // (lr 1e-50 would become 0, a beta of 0.99999999 would become 1).
  const auto as_float = [](double v) { return static_cast<double>(static_cast<float>(v)); };
  for (const auto& [key, v] : {std::pair<const char*, double>{"optimizer.lr", optimizer.lr},
                               {"optimizer.eps", optimizer.eps},
                               {"optimizer.weight_decay", optimizer.weight_decay},
                               {"optimizer.momentum", optimizer.momentum},
                               {"optimizer.grad_clip", optimizer.grad_clip},
                               {"schedule.min_lr", schedule.min_lr}})
    TAPEFORMER_CHECK(std::isfinite(as_float(v)), "config: '", key, "' (", v, ") is too large for a float");
  TAPEFORMER_CHECK(as_float(optimizer.lr) > 0, "config: 'optimizer.lr' must be > 0 (as a float), got ", optimizer.lr);
  for (double b : optimizer.betas) {
    char shown[32];
    std::snprintf(shown, sizeof shown, "%.10g", b);  // 0.99999999, not the stream's rounded "1"
    TAPEFORMER_CHECK(b >= 0 && as_float(b) < 1, "config: 'optimizer.betas' must be in [0, 1) (as floats), got ", shown);
  }
  TAPEFORMER_CHECK(as_float(optimizer.eps) > 0, "config: 'optimizer.eps' must be > 0 (as a float), got ",
                   optimizer.eps);
  TAPEFORMER_CHECK(optimizer.weight_decay >= 0, "config: 'optimizer.weight_decay' must be >= 0, got ",
                   optimizer.weight_decay);
  // A momentum of 1 or more never forgets a gradient: the steps grow without bound.
  TAPEFORMER_CHECK(optimizer.momentum >= 0 && as_float(optimizer.momentum) < 1,
                   "config: 'optimizer.momentum' must be in [0, 1) (as a float), got ", optimizer.momentum);
  TAPEFORMER_CHECK(optimizer.grad_clip == 0 || as_float(optimizer.grad_clip) > 0,
                   "config: 'optimizer.grad_clip' must be 0 (off) or > 0 (as a float), got ", optimizer.grad_clip);
  TAPEFORMER_CHECK(schedule_kinds().find(schedule.name) != nullptr, "config: 'schedule.name' must be one of ",
                   schedule_kinds().names(), ", got \"", schedule.name, "\"");
  TAPEFORMER_CHECK(schedule.warmup_iters >= 0 && schedule.warmup_iters <= INT32_MAX,
                   "config: 'schedule.warmup_iters' must be in [0, ", INT32_MAX, "], got ", schedule.warmup_iters);
  TAPEFORMER_CHECK(schedule.decay_iters <= INT32_MAX, "config: 'schedule.decay_iters' must be at most ", INT32_MAX,
                   ", got ", schedule.decay_iters);
  TAPEFORMER_CHECK(schedule.decay_iters >= schedule.warmup_iters, "config: 'schedule.decay_iters' (",
                   schedule.decay_iters, ") must be >= 'schedule.warmup_iters' (", schedule.warmup_iters, ")");
  TAPEFORMER_CHECK(schedule.min_lr >= 0 && schedule.min_lr <= optimizer.lr, "config: 'schedule.min_lr' (",
                   schedule.min_lr, ") must be in [0, optimizer.lr = ", optimizer.lr, "]");
  positive("eval.interval", eval.interval);
  positive("eval.iters", eval.iters);
  positive("eval.final_iters", eval.final_iters);
  TAPEFORMER_CHECK(eval.mem_len >= 0 && eval.mem_len <= 1 << 20, "config: 'eval.mem_len' must be in [0, 2^20], got ",
                   eval.mem_len);
  const auto model_mem = model.options.find("mem_len");
  const bool has_memory = model_mem != model.options.end() && std::holds_alternative<int64_t>(model_mem->second) &&
                          std::get<int64_t>(model_mem->second) > 0;
  TAPEFORMER_CHECK(eval.mem_len == 0 || has_memory, "config: 'eval.mem_len' = ", eval.mem_len,
                   " applies only to a model with a memory; this model has none (model.mem_len = 0): leave "
                   "eval.mem_len at 0 or set model.mem_len");
  positive("checkpoint.interval", checkpoint.interval);
  positive("log.interval", log.interval);
}

std::string json_error_text(const std::string& what) {
  const size_t tag_end = what.find("] ");
  return what.rfind("[json.exception.", 0) == 0 && tag_end != std::string::npos ? what.substr(tag_end + 2) : what;
}

Registry<OptimizerKind>& optimizer_kinds() {
  const auto adam_args = [](const OptimizerConfig& c) {
    return std::make_tuple(static_cast<float>(c.betas[0]), static_cast<float>(c.betas[1]), static_cast<float>(c.eps));
  };
  const auto groups = [](const OptimizerConfig& c, const NamedVars& params) {
    return decay_groups(params, static_cast<float>(c.lr), static_cast<float>(c.weight_decay));
  };
  static Registry<OptimizerKind> kinds(
      "optimizer.name",
      {{"adamw", "Adam with decoupled weight decay",
        [=](const OptimizerConfig& c, const NamedVars& params) -> std::unique_ptr<Optimizer> {
          const auto [b1, b2, eps] = adam_args(c);
          return std::make_unique<AdamW>(groups(c, params), b1, b2, eps);
        }},
       {"adam", "Adam, weight decay as L2 in the gradient",
        [=](const OptimizerConfig& c, const NamedVars& params) -> std::unique_ptr<Optimizer> {
          const auto [b1, b2, eps] = adam_args(c);
          return std::make_unique<Adam>(groups(c, params), b1, b2, eps);
        }},
       {"sgd", "SGD with momentum (optionally Nesterov)",
        [=](const OptimizerConfig& c, const NamedVars& params) -> std::unique_ptr<Optimizer> {
          return std::make_unique<SGD>(groups(c, params), static_cast<float>(c.momentum), 0.0f, c.nesterov);
        }}});
  return kinds;
}

Registry<ScheduleKind>& schedule_kinds() {
  // The schedules' common arguments: peak lr, warmup, decay end, floor.
  using Args = std::tuple<float, int64_t, int64_t, float>;
  const auto args = [](const TrainConfig& c) {
    return Args{static_cast<float>(c.optimizer.lr), c.schedule.warmup_iters, c.schedule.decay_iters,
                static_cast<float>(c.schedule.min_lr)};
  };
  const auto warmup_decay = [args](auto make) {
    return [args, make](const TrainConfig& c) -> std::unique_ptr<Schedule> { return std::apply(make, args(c)); };
  };
  static Registry<ScheduleKind> kinds(
      "schedule.name",
      {{"constant", "optimizer.lr throughout",
        [](const TrainConfig& c) -> std::unique_ptr<Schedule> {
          return std::make_unique<ConstantSchedule>(static_cast<float>(c.optimizer.lr));
        }},
       {"linear", "warmup, then linear decay to min_lr at decay_iters",
        warmup_decay([](float lr, int64_t w, int64_t d, float m) { return std::make_unique<LinearSchedule>(lr, w, d, m); })},
       {"cosine", "warmup, then cosine decay to min_lr at decay_iters",
        warmup_decay([](float lr, int64_t w, int64_t d, float m) { return std::make_unique<CosineSchedule>(lr, w, d, m); })},
       {"step", "warmup, lr, then min_lr from decay_iters",
        warmup_decay([](float lr, int64_t w, int64_t d, float m) { return std::make_unique<StepSchedule>(lr, w, d, m); })}});
  return kinds;
}

int64_t LoopConfig::recompute_every() const {
  if (recompute == "none") return 0;
  if (recompute == "blocks") return 1;
  const std::string prefix = "blocks:";
  if (recompute.rfind(prefix, 0) == 0) {
    const std::string k = recompute.substr(prefix.size());
    if (!k.empty() && k.size() <= 6 && k.find_first_not_of("0123456789") == std::string::npos && std::stoll(k) >= 1)
      return std::stoll(k);
  }
  fail("config: 'train.recompute' must be \"none\", \"blocks\" or \"blocks:K\" (every K-th block, K >= 1), got \"",
       recompute, "\"");
}

bool key_may_change_on_resume(const std::string& key) {
  return key == "train.max_iters" || key == "train.threads" || key == "train.shards" || key == "train.precision" ||
         key == "train.recompute" ||
         key == "data.path" ||
         key.rfind("eval.", 0) == 0 || key.rfind("checkpoint.", 0) == 0 || key.rfind("log.", 0) == 0;
}

void adopt_resume_config(TrainConfig& saved, const TrainConfig& wanted, const std::string& out_dir, bool started) {
  const auto was = saved.fields(), now = wanted.fields();
  for (size_t i = 0; i < was.size(); ++i) {
    const std::string& key = was[i].first;
    if (was[i].second == now[i].second) continue;
    // The model (but its dropout) and the tokenizer are the checkpoint's, started or not.
    const bool kept = (key.rfind("model.", 0) == 0 && key != "model.dropout") || key == "data.tokenizer" || key == "data.vocab_size" ||
                      key == "data.sp_type" || key == "data.sp_model" || key == "data.tokenizer_path";
    if (!started && kept)
      fail("cannot resume '", out_dir, "': its model and tokenizer are fixed (", key, " = ", was[i].second,
           ", and the config asks for ", now[i].second, "); no step was trained yet, so every other key may change");
    if (!started) continue;
    if (!key_may_change_on_resume(key))
      fail("cannot resume '", out_dir, "': the checkpoint was trained with ", was[i].first, " = ", was[i].second,
           " but the config asks for ", now[i].second,
           " (only train.max_iters, train.threads, train.shards, train.precision, train.recompute, data.path, eval.*, "
           "checkpoint.* and log.* may change)");
  }
  const int64_t vocab_size = saved.model.vocab_size;
  saved = wanted;
  saved.model.vocab_size = vocab_size;
}

}  // namespace tapeformer
