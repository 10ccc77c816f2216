// Attention: the interface every attention kind implements, and the table of
// kinds a config selects by name (`model.attention`).
//
//   ModelConfig cfg;  cfg.attention = "linear";
//   auto pos = positional_kinds().get(cfg.positional).make(cfg, rng);
//   std::shared_ptr<Attention> attn = attention_kinds().get(cfg.attention).make(cfg, pos->make_layer(rng), rng);
//   Var y = attn->forward(x, rng);                       // (B, T, C) -> (B, T, C), causal
//
//   NoGradGuard no_grad;  attn->eval();
//   auto state = attn->make_state(/*batch=*/1, /*window=*/64);
//   y = attn->forward(x_prompt, *state);                 // (1, t, C)
//   y = attn->forward(x_next, *state);                   // (1, 1, C): the past is not recomputed
//
// Every kind is self-attention over its input's positions, with the
// projections, heads and output projection of a Transformer layer inside
// (x -> y, both (B, T, C)), and carries a PositionalLayer for the scheme's
// part (rotations, score biases, relative terms). What it may read is its
// kind's `causality` (below): causal for language models, bidirectional for
// encoders (ModelConfig::causal = false). Its inference state holds what it
// needs to continue a sequence (softmax: a KV cache of the last `window`
// positions; linear: the running sums S, z, O(1) in the length).
//
// Kinds: the table in layers/attention/registry.cpp, one file pair each
// beside it (`tapeformer kinds` and docs/kinds.md list them). Adding one:
// docs/adding-an-attention-kind.md.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/core/registry.h"
#include "tapeformer/layers/inference_state.h"
#include "tapeformer/layers/model_config.h"
#include "tapeformer/layers/positional/positional.h"

namespace tapeformer {

// What an attention kind's output at position i reads.
enum class Causality {
  strict,           // inputs at positions <= i only (causal models)
  chunk_dependent,  // no later value, but where later tokens fall moves which keys i is compared with
                    // (LSH's buckets and chunks; causal models, its tests say what holds instead)
  bidirectional,    // every position (encoders: ModelConfig::causal = false; no language model)
  either,           // strict, or bidirectional when ModelConfig::causal is false
};
// "strict", "chunk-dependent", ...: for errors and docs.
const char* causality_name(Causality c);
// Whether a kind of causality `c` serves a model with ModelConfig::causal = `causal`.
bool serves(Causality c, bool causal);

class Attention : public Module {
 public:
  // The layer's positional part is registered as its child "pos".
  explicit Attention(std::shared_ptr<PositionalLayer> pos);

  // Self-attention over x (B, T, C), positions 0..T-1 -> (B, T, C): causal or
  // not as the kind's `causality` and ModelConfig::causal say.
  virtual Var forward(const Var& x, Rng& rng) const = 0;

  // State for reading a sequence piece by piece. window: how many of the
  // most recent positions a layer that stores them keeps (older ones drop
  // out); -1 for all. Layers whose state does not grow ignore it.
  virtual std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const = 0;
  // x (B, T, C) holds the T positions after those the state has seen; they
  // attend to the state's past and causally to each other; the state takes
  // them in. Needs NoGradGuard and eval(). Equals the matching rows of
  // forward() on the whole sequence while the window holds it (to float
  // rounding; bit for bit from an empty state where the kind says so).
  virtual Var forward(const Var& x, InferenceState& state) const = 0;

  // Reading piece by piece when only some of x's positions need an output
  // (early exit, ACT halting: the others left or halted, yet later positions
  // read their keys): the state takes in every position of x as
  // forward(x, state) does, and only the rows `rows` are computed, flat
  // indices b * T + t into x's (B, T), ascending -> (1, R, C), each row
  // forward(x, state)'s bit for bit. With rows empty the state only takes x
  // in (a KV cache: the keys and values) and the result is (1, 0, C). By
  // default forward(x, state) and its rows picked: the same numbers, no time saved.
  virtual Var forward_rows(const Var& x, InferenceState& state, const std::vector<int64_t>& rows) const;

  // Transformer-XL: x (B, T, C) at positions M..M+T-1 attends causally to
  // itself and to all of `memory` (B, M, C), the (normalised) inputs of the
  // M positions before it, which get no gradient -> (B, T, C). An undefined
  // or empty memory is forward(x, rng). Kinds without it refuse.
  virtual Var forward(const Var& x, const Var& memory, Rng& rng) const;

  // Content attention of x's queries (B, T, C) over rows (B, N, C), every
  // row visible, no positional terms, before the output projection, with
  // this layer's weights held fixed (no gradient reaches them) -> (B, T, C):
  // a memory's view of what the layer would read in rows (the Compressive
  // Transformer's attention-reconstruction loss, layers/memory/compressive.h).
  // Kinds without it refuse.
  virtual Var content_attention(const Var& x, const Var& rows) const;

  const PositionalLayer& positional() const { return *pos_; }
  std::shared_ptr<PositionalLayer> positional_layer() const { return pos_; }

 protected:
  // A wrapper of another attention (the Memorizing Transformer's,
  // layers/memory/memorizing.h) shares its positional part and registers
  // the wrapped one inline: `pos` is not registered again.
  struct Wraps {};
  Attention(std::shared_ptr<PositionalLayer> pos, Wraps);

  // Refuses the inference forward outside NoGradGuard + eval, naming `who`.
  void check_inference(const char* who, const Var& x, int64_t n_embd) const;

 private:
  std::shared_ptr<PositionalLayer> pos_;
};

struct AttentionKind {
  std::string name;
  std::string summary;                // one line, for errors and docs
  std::vector<ModelOption> options;   // the model.* keys it reads (e.g. feature_map)
  std::function<std::shared_ptr<Attention>(const ModelConfig&, std::shared_ptr<PositionalLayer>, Rng&)> make;
  // Parameters of one layer, its positional part excluded (in double: a
  // config too large for any machine is measured and refused, not overflowed).
  std::function<double(const ModelConfig&)> parameters;
  // Throws Error naming the keys when the config cannot use this kind: its
  // options' values, and positional schemes whose needs its math lacks.
  std::function<void(const ModelConfig&, const PositionalKind&)> check;
  // Whether forward(x, memory, rng) is implemented (Transformer-XL memory).
  bool segment_memory = false;
  // What an output may read, and so which ModelConfig::causal it serves.
  Causality causality = Causality::strict;
};

// The table of attention kinds (layers/attention/registry.cpp). A program may
// add its own at start-up: attention_kinds().add({...}).
Registry<AttentionKind>& attention_kinds();

// cfg.attention's layer with `pos` inside; Error when its entry's parameter
// count (AttentionKind::parameters) is not the built layer's, naming the kind.
std::shared_ptr<Attention> make_attention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng);

// ---- helpers shared by the kinds -------------------------------------------
// (the head split of a packed qkv projection is the op split_heads, autograd/ops.h)

// Rows of x (B, T, C) at flat indices b * T + t, ascending -> (1, R, C)
// (Attention::forward_rows's result).
Var pick_rows(const Var& x, const std::vector<int64_t>& rows);
// Error naming `who` unless rows ascend strictly within [0, N).
void check_rows(const std::vector<int64_t>& rows, int64_t N, const char* who);

// y (B, H, T, D) -> (B, T, C), heads side by side (a view when y's memory is
// (B, T, H, D), as softmax_attention's output is).
Var merge_heads(const Var& y);

// The terms a positional scheme puts on (query, key) pairs that a kind's
// math cannot carry (its AttentionKind::check refuses them).
enum class PairTerms {
  learned,               // PositionalNeeds::relative_terms (Shaw, Transformer-XL): learned per-pair terms
  scores,                // those and score_bias (ALiBi): every term on the T x T scores
  scores_and_rotations,  // those and rotates_qk (RoPE): anything that reads the pair's positions
};
// Throws Error when the scheme `pos` has terms of `refused`, naming it and
// the kind `kind`: model.positional "<pos>" does not combine with
// model.attention "<kind>": <why>.
void refuse_pair_terms(const PositionalKind& pos, PairTerms refused, const std::string& kind, const char* why);

}  // namespace tapeformer
