// What a checkpoint may hold: weights a run can continue from. The Trainer
// asks before every save; weights that fail end the run as diverged, and
// the checkpoint on disk stays.
#pragma once

#include <string>

#include "tapeformer/core/rng.h"
#include "tapeformer/data/sampler.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/optim/optimizer.h"

namespace tapeformer {

// What is wrong with saving, or "": a loss that is not finite, weights or
// optimizer state holding a NaN or an infinity (named), or weights that give
// a loss that is not finite on the step's own last batch (an update can
// overflow after a finite loss; read in eval mode, with a copy of the
// dropout stream, so the run's state is untouched).
std::string unsaveable(double loss, LanguageModel& model, const Optimizer& optimizer, const Batch& last_batch,
                       const Rng& dropout_rng);

}  // namespace tapeformer
