// ModelConfig: the architecture of a TransformerLM, the `model.*` keys of a
// training config.
//
//   ModelConfig cfg;                          // the nanoGPT CPU model
//   cfg.vocab_size = 65;
//   cfg.attention = "linear";                 // a registered attention kind
//   cfg.positional = "rope";                  // a registered positional scheme
//   cfg.options["feature_map"] = std::string("cos");   // "model.feature_map"
//   cfg.validate();                           // Error naming the first bad key
//
// Kind-specific keys ("model.feature_map" of linear attention,
// "model.rel_clip" of Shaw's positions) are declared by the kinds themselves
// (ModelOption in their registry entries), so a new kind adds its keys
// without touching the config reader: `options` holds the values a config
// set, and option_*() return them or the declaring kind's default. A key
// whose kinds are not selected must keep its default (a config asking for
// "feature_map": "cos" with softmax attention is refused, not ignored).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tapeformer/core/kernels/activation.h"

namespace tapeformer {

// A kind-specific config value: true/false, an integer, a number or a string.
using OptionValue = std::variant<bool, int64_t, double, std::string>;

// A `model.NAME` key that a kind reads, with its default and a one-line doc.
// `small`: the value the whole-model tests use on sequences of 12 tokens
// (tests/layers/test_attention_kinds.cpp), where the default would leave
// the key's code path idle (a window of 64 over 12 tokens is no window).
struct ModelOption {
  std::string name;  // without "model.": "feature_map"
  OptionValue default_value;
  std::string doc;
  std::optional<OptionValue> small = std::nullopt;
};

struct ModelConfig {
  int64_t vocab_size = 0;   // tokens; set from the tokenizer when training
  int64_t block_size = 64;  // training context, in tokens (and the longest, with learned positions)
  int64_t n_layer = 4;      // Transformer blocks
  int64_t n_head = 4;       // attention heads; must divide n_embd
  int64_t n_embd = 128;     // model width
  float dropout = 0.0f;     // on attention weights, residual branches and embeddings
  bool bias = true;         // biases in Linear and LayerNorm layers
  float norm_eps = 1e-5f;   // LayerNorm's epsilon: y = (x - mean) / sqrt(var + eps) (GPT-2's layer_norm_epsilon)
  bool tie_weights = true;  // output head shares the token embedding matrix
  std::string activation = "gelu";  // standard MLP: "gelu" (tanh form) | "relu" | "silu" (layers/activations.h)
  std::string mlp = "standard";     // feed-forward kind: "standard" | "swiglu" | "geglu" (layers/mlp.h)
  std::string attention = "softmax";  // attention kind: "softmax" | "linear" (layers/attention/attention.h)
  std::string positional = "learned";  // "learned" | "sinusoidal" | "rope" | "alibi" | "shaw" | "txl" (layers/positional/positional.h)
  std::string arch = "transformer";  // the model kind (layers/language_model.h); the keys above are its
  std::string block = "standard";  // how the layers are wired: a block kind (layers/block/block.h; `tapeformer kinds`)
  std::map<std::string, OptionValue> options;  // kind-specific keys by name (without "model.")
  // Causal self-attention (every language model). A non-causal model (an
  // encoder, examples/linformer_encoder) sets it false in C++; configs cannot.
  // The attention kind's `causality` must serve it (validate_kinds refuses
  // otherwise): softmax serves both, linformer only false, the rest only true.
  bool causal = true;

  // The value of a declared option: set in `options`, else its default.
  // Error if no registered kind declares it or it has another type.
  std::string option_string(const std::string& name) const;
  int64_t option_int(const std::string& name) const;
  double option_number(const std::string& name) const;
  bool option_bool(const std::string& name) const;

  // Throws Error naming the first invalid field (vocab_size included).
  void validate() const;
  // The attention, positional, block and MLP kinds, their options and
  // whether they combine (everything but the sizes); Error naming the key.
  void validate_kinds() const;
};

// GPT-2's init std of the projections that write into the residual stream,
// 0.02 / sqrt(2 n_layer), so its variance does not grow with depth.
float residual_init_std(const ModelConfig& cfg);

// Every option some registered kind declares, by name, with the keys and
// kinds that read it ("model.attention \"linear\"").
struct DeclaredOption {
  ModelOption option;
  std::vector<std::string> readers;
};
std::vector<DeclaredOption> model_options();

// The value `values` holds for the option `decl` (its default when unset),
// read by code as variant index `type`; Error naming `section`.NAME when the
// declaration or the value has another type. The model's and the optimizers'
// kind-specific keys are both read through it.
OptionValue declared_value(const ModelOption& decl, const std::map<std::string, OptionValue>& values,
                           const std::string& section, size_t type);

// "elu1", 16, 0.5, true: how a value reads in a config file and in errors.
std::string option_to_string(const OptionValue& v);
// "a string", "an integer", ...
const char* option_type_name(const OptionValue& v);

}  // namespace tapeformer
