// The memory a training run needs, so that a run that cannot fit is refused
// at once with the keys that size it, not killed by the kernel an hour
// later. Checked twice: before anything is allocated (the parameters the
// kinds count, and the logits every model keeps), and once the model is
// built, with the activations one sequence keeps measured on it:
//
//   check_fits_in_memory(cfg, shards);                               // Error: "config: this run needs at least ..."
//   auto model = make_model(cfg.model, rng);
//   check_fits_in_memory(cfg, shards, activation_floats(*model));   // layers/language_model.h
#pragma once

#include <cstdint>
#include <optional>

#include "tapeformer/train/config.h"

namespace tapeformer {

// A run's peak memory in bytes, a lower bound: parameters with their
// gradients (one per shard) and AdamW's two moments, batch_size sequences'
// activations (activation_floats each; without it, the logits and their
// softmax, 2 T V floats) and the evaluation batches.
double estimated_training_bytes(const TrainConfig& c, int64_t shards, std::optional<double> activation_floats = {});
// Error when the estimate plus what the process already holds (a text
// corpus, read before the model is built) exceeds this machine's RAM: it
// names the sizing keys, or, when the memory held is the larger part, points
// at token files for data.path (`tapeformer prepare`, read window by window).
void check_fits_in_memory(const TrainConfig& c, int64_t shards, std::optional<double> activation_floats = {});

}  // namespace tapeformer
