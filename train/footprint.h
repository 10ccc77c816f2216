// The memory a training run needs, estimated from the config before
// anything is allocated, so that a run that cannot fit is refused at once
// with the keys that size it, not killed by the kernel an hour later.
//
//   check_fits_in_memory(cfg, shard_count(cfg));   // Error: "config: this run needs at least ..."
#pragma once

#include <cstdint>

#include "tapeformer/train/config.h"

namespace tapeformer {

// A lower bound on a run's peak memory in bytes: parameters with their
// gradients (one per shard) and AdamW's two moments, the activations a step
// keeps for backward (the model kind's footprint, layers/language_model.h),
// and the evaluation batches.
double estimated_training_bytes(const TrainConfig& c, int64_t shards);
// Error when the estimate plus what the process already holds (a text
// corpus, read before the model is built) exceeds this machine's RAM: it
// names the sizing keys, or, when the memory held is the larger part, points
// at token files for data.path (`tapeformer prepare`, read window by window).
void check_fits_in_memory(const TrainConfig& c, int64_t shards);

}  // namespace tapeformer
