// LanguageModel: what the Trainer, DataParallel, generation, `eval`,
// checkpoints and export need of a model, and the table of model kinds a
// config selects by name (`model.arch`). TransformerLM (layers/transformer.h)
// is the built-in kind "transformer"; a program may add its own (a character
// MLP in examples/custom_attention) and train, sample and resume it through
// the stock Trainer and command line.
//
//   std::unique_ptr<LanguageModel> model = make_model(cfg, rng);   // cfg.arch's kind
//   Var logits = model->forward(ids, rng);                          // ids (B, T) -> (B, T, V)
//   auto state = model->make_state(/*batch=*/1);                     // sampling, piece by piece
//   logits = model->forward(next_ids, *state);
//
// Parameters, buffers, checkpoints (state/load_state), replicas that share
// parameters (alias_parameters) and train/eval mode come from Module.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/core/registry.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/inference_state.h"
#include "tapeformer/layers/model_config.h"
#include "tapeformer/layers/module.h"

namespace tapeformer {

// What a model of a config costs, computed from its kinds before anything is
// allocated (the trainer's memory check); parameters equals the built
// model's num_parameters() for every registered kind (tested).
struct ModelFootprint {
  double parameters = 0;  // exact up to 2^53; double so that absurd configs are measured, not overflowed
  double activation_floats = 0;  // kept for the backward of one sequence of block_size tokens
};

class LanguageModel : public Module {
 public:
  // ids (B, T) -> logits (B, T, V), causal: logits at t read ids at <= t.
  virtual Var forward(const IndexTensor& ids, Rng& rng) const = 0;
  // Reading a sequence piece by piece (sampling): forward(ids, state) takes
  // the T positions after those the state has seen, ids (B, T) -> (B, T, V),
  // equal to the matching rows of forward() on the whole sequence while it
  // fits in `window` (0: block_size). Needs NoGradGuard and eval().
  virtual std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window = 0) const = 0;
  virtual Var forward(const IndexTensor& ids, InferenceState& state) const = 0;
  // A segment memory carried across training steps (Transformer-XL): mem_len
  // positions (0: none, the default) and ext_len re-fed tokens.
  virtual int64_t mem_len() const { return 0; }
  virtual int64_t ext_len() const { return 0; }
  // ids (B, T): the segment after those `memory` holds. Models without a
  // memory refuse it.
  virtual Var forward(const IndexTensor& ids, SegmentMemory& memory, Rng& rng) const;
  // The context vectors the output head reads (kNN-LM's keys and queries,
  // train/knn.h): ids (B, T) -> (B, T, C), with `memory` the segment memory
  // as forward(ids, memory, rng) takes it (null: none), so that
  // logits_from_features(features(...)) equals forward(...) bit for bit.
  // features(ids, state) is the same for reading piece by piece, equal to
  // forward(ids, state) through logits_from_features. A kind that does not
  // provide them refuses, naming itself.
  virtual Var features(const IndexTensor& ids, SegmentMemory* memory, Rng& rng) const;
  virtual Var features(const IndexTensor& ids, InferenceState& state) const;
  // features (B, T, C) -> logits (B, T, V): the output head alone.
  virtual Var logits_from_features(const Var& features) const;
  // Tokens retrieved for every position that the model reads beside ids
  // (SPALM's long-term memory, layers/spalm.h): K per position, 0 (the
  // default) for a model that reads none.
  virtual int64_t retrieved_per_position() const { return 0; }
  // ids (B, T) and retrieved (B, T, K) token ids (-1: none; empty when K is
  // 0) -> logits (B, T, V), with `memory` as forward(ids, memory, rng) takes
  // it (null: none). The default, for a model that reads none, refuses a
  // non-empty `retrieved` and is forward(ids, memory, rng) or forward(ids, rng).
  virtual Var forward_retrieved(const IndexTensor& ids, const IndexTensor& retrieved, SegmentMemory* memory,
                                Rng& rng) const;
  // The same read piece by piece (sampling): ids (B, T) and retrieved
  // (B, T, K) through make_state's state -> logits (B, T, V). The default
  // refuses a non-empty `retrieved` and is forward(ids, state).
  virtual Var forward_retrieved(const IndexTensor& ids, const IndexTensor& retrieved, InferenceState& state) const;
  // The longest sequence forward() takes, or -1 for any length.
  virtual int64_t max_positions() const { return -1; }
  virtual const ModelConfig& config() const = 0;
};

struct ModelKind {
  std::string name;
  std::string summary;               // one line, for errors and docs
  std::vector<ModelOption> options;  // its own model.* keys
  std::function<std::unique_ptr<LanguageModel>(const ModelConfig&, Rng&)> make;
  // Parameters and activation memory of a model of the config (see ModelFootprint).
  std::function<ModelFootprint(const ModelConfig&)> footprint;
};

// The table of model kinds (layers/transformer.cpp adds "transformer").
Registry<ModelKind>& model_kinds();
// cfg.arch's kind, built (GPT-2 init for the transformer).
std::unique_ptr<LanguageModel> make_model(const ModelConfig& cfg, Rng& rng);
// cfg.arch's footprint.
ModelFootprint model_footprint(const ModelConfig& cfg);

}  // namespace tapeformer
