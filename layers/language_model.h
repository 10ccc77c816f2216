// LanguageModel: what the Trainer, DataParallel, generation, `eval`,
// checkpoints and export need of a model, and the table of model kinds a
// config selects by name (`model.arch`). TransformerLM (layers/transformer.h)
// is the built-in kind "transformer"; a program may add its own (a character
// MLP in examples/custom_attention) and train, sample and resume it through
// the stock Trainer and command line.
//
// A model is called one way, forward(ids, context), for training,
// evaluation and sampling alike; the context says what it reads beside the
// ids (a segment memory, an inference state, extra inputs, dropout draws):
//
//   std::unique_ptr<LanguageModel> model = make_model(cfg, rng);   // cfg.arch's kind
//   Var logits = model->forward(ids, rng);                          // ids (B, T) -> (B, T, V)
//   auto state = model->make_state(/*batch=*/1);                     // sampling, piece by piece
//   logits = model->forward(next_ids, *state);
//   ModelContext ctx;  ctx.memory = &memory;  ctx.rng = &rng;  ctx.features = true;
//   Var h = model->forward(ids, ctx);                                // (B, T, C): what the head reads
//
// (the two-argument forms are shorthands for a context). Parameters,
// buffers, checkpoints (state/load_state), replicas that share parameters
// (alias_parameters) and train/eval mode come from Module.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tapeformer/core/registry.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/inference_state.h"
#include "tapeformer/layers/model_config.h"
#include "tapeformer/layers/module.h"

namespace tapeformer {

// What a model of a config costs, computed from its kinds before anything is
// allocated (the trainer's memory check): make_model refuses a kind whose
// count is not the built model's num_parameters(). The activation memory is
// measured on the built model instead (activation_floats below).
struct ModelFootprint {
  double parameters = 0;  // exact up to 2^53; double so that absurd configs are measured, not overflowed
};

// Extra per-position inputs by name, each (B, T, ...) ids: what a model kind
// reads beside the tokens (SPALM's "retrieved" tokens, (B, T, K)).
using ModelInputs = std::map<std::string, IndexTensor>;

// What a model reads beside the ids in one call.
struct ModelContext {
  Rng* rng = nullptr;                  // dropout's draws (training); null: none (eval mode draws none)
  SegmentMemory* memory = nullptr;     // the memories carried from segment to segment (memory_use()), or null
  InferenceState* state = nullptr;     // reading piece by piece: make_state's state; null: the whole sequence
  const ModelInputs* inputs = nullptr;  // extra inputs, or null
  // The training targets of ids (B, T) (kIgnoreTarget where none counts),
  // set by the training step (DataParallel::train_batch) and null
  // elsewhere: a model whose auxiliary loss of the batch needs them (the
  // early-exit heads' losses) reads them here.
  const IndexTensor* targets = nullptr;
  // Return the context vectors the output head reads, (B, T, C), instead of
  // the logits (kNN-LM's keys and queries, train/knn.h):
  // logits_from_features(forward with features) equals forward bit for bit.
  bool features = false;
};

class LanguageModel : public Module {
 public:
  // ids (B, T) -> logits (B, T, V) (or features, ctx.features), causal:
  // position t reads ids at <= t. With ctx.memory, ids is the segment after
  // those the memory holds, which then moves on (models that carry none
  // refuse it). With ctx.state, ids holds the T positions after those the
  // state has seen, equal to the matching rows of the whole-sequence forward
  // while they fit in its window (needs NoGradGuard and eval()).
  virtual Var forward(const IndexTensor& ids, const ModelContext& ctx) const = 0;
  // State for reading a sequence piece by piece (sampling): window (0:
  // block_size) is how many recent positions layers that store them keep.
  virtual std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window = 0) const = 0;
  // features (B, T, C) -> logits (B, T, V): the output head alone. A kind
  // that does not expose its features refuses, naming itself.
  virtual Var logits_from_features(const Var& features) const;
  // The segment memory it carries (none by default).
  virtual MemoryUse memory_use() const { return {}; }
  // The longest sequence forward() takes, or -1 for any length.
  virtual int64_t max_positions() const { return -1; }
  virtual const ModelConfig& config() const = 0;

  // Activation recompute (autograd/recompute.h) for every block stack in the
  // model: layers 0, every, 2 every, ... of each keep only their inputs and
  // run again in the backward (0: none, the default). Gradients, and so
  // training, are the same bits; the activations one sequence keeps shrink.
  void set_recompute(int64_t every);
  int64_t recompute_every() const { return recompute_every_; }

  // Early exit and ACT halting (layers/adaptive_depth.h) in every part of
  // the model that stops positions early: full = every layer runs for every
  // position (the same numbers, no time saved); false, the default, skips
  // the stopped positions' work when reading piece by piece. Returns
  // whether the model has such a part (false: the setting changes nothing).
  bool set_full_depth(bool full);

  // Shorthands for a context (a kind that defines forward(ids, ctx) keeps
  // them with `using LanguageModel::forward;`):
  Var forward(const IndexTensor& ids, Rng& rng) const;                           // whole sequences, training
  Var forward(const IndexTensor& ids, SegmentMemory& memory, Rng& rng) const;    // the next segment
  Var forward(const IndexTensor& ids, InferenceState& state) const;              // the next positions

 private:
  int64_t recompute_every_ = 0;
};

struct ModelKind {
  std::string name;
  std::string summary;               // one line, for errors and docs
  std::vector<ModelOption> options;  // its own model.* keys
  std::function<std::unique_ptr<LanguageModel>(const ModelConfig&, Rng&)> make;
  // Parameters of a model of the config (see ModelFootprint).
  std::function<ModelFootprint(const ModelConfig&)> footprint;
  // What a tiny config of this kind needs beyond its small options (the
  // checks' and whole-model tests' config; SPALM: a Transformer-XL); null: nothing.
  std::function<void(ModelConfig&)> small_config;
  // The extra inputs (ModelContext::inputs) a model of the config reads
  // beside ids (B, T), filled with placeholder tokens of the right shapes
  // (SPALM: "retrieved", (B, T, K)): what the memory measurement and the
  // conformance checks run it on. Null: it reads none.
  std::function<ModelInputs(const ModelConfig&, int64_t B, int64_t T)> example_inputs;
};

// The table of model kinds (layers/language_model.cpp holds it; `tapeformer kinds` lists them).
Registry<ModelKind>& model_kinds();
// cfg.arch's kind, built (GPT-2 init for the transformer).
std::unique_ptr<LanguageModel> make_model(const ModelConfig& cfg, Rng& rng);
// cfg.arch's footprint.
ModelFootprint model_footprint(const ModelConfig& cfg);

// Floats one training forward of one sequence of block_size tokens keeps for
// the backward (activations, dropout masks, the logits), measured on the
// built model: token 0 everywhere and the kind's example_inputs; with a
// segment memory, the second segment, so that the memories are full. The
// model's parameters, memories, mode and batch statistics (zero) are left
// as they were; its dropout draws come from a generator of its own.
double activation_floats(LanguageModel& model);
// The same over a window of T <= block_size tokens.
double activation_floats(LanguageModel& model, int64_t T);
// A floor of activation_floats for cfg's model (with recompute every
// `recompute_every` layers, LanguageModel::set_recompute), measured on a model of the
// same config but a block of 1024 tokens, over two windows (512 and 1024
// tokens) instead of the whole block: what a forward keeps grows with the
// window at least along the line through those two (linearly, or faster
// for scores kept whole). So a block no machine could hold is refused
// before its model is built (a learned position table of a million rows
// takes seconds to initialise) and without a forward over the whole block.
// nullopt when block_size <= 1024 (the measure itself is quick) or when the
// kind does not build or read at that size.
std::optional<double> activation_floats_floor(const ModelConfig& cfg, int64_t recompute_every = 0);

}  // namespace tapeformer
