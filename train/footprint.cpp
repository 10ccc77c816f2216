#include "tapeformer/train/footprint.h"

#include <algorithm>
#include <cstdio>

#include <unistd.h>

#include "tapeformer/core/error.h"
#include "tapeformer/core/storage.h"
#include "tapeformer/data/corpus.h"
#include "tapeformer/layers/language_model.h"

namespace tapeformer {

// Parameters (the model kind's count, which make_model holds to the built
// model's) with their gradients (one per shard) and AdamW's two moments,
// the activations of a step's batch, and the evaluation batches. Without a
// measured figure, the activations are the floor every language model
// keeps: its logits and their softmax, 2 T V floats a sequence.
double estimated_training_bytes(const TrainConfig& c, int64_t shards, std::optional<double> activation_floats) {
  const double params = model_footprint(c.model).parameters;
  const double B = static_cast<double>(c.train.batch_size), T = static_cast<double>(c.model.block_size);
  const double per_sequence = activation_floats ? *activation_floats : 2 * T * static_cast<double>(c.model.vocab_size);
  const double eval_batches = (static_cast<double>(c.eval.iters) + static_cast<double>(c.eval.final_iters)) * B * T * 2;
  return 4 * (params * (3 + static_cast<double>(shards)) + B * per_sequence + eval_batches);
}

namespace {

// Bytes of memory the process holds now (resident set), 0 when unknown.
double resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const bool ok = std::fscanf(f, "%llu %llu", &size, &resident) == 2;
  std::fclose(f);
  return ok ? static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGE_SIZE)) : 0;
}

}  // namespace

void check_fits_in_memory(const TrainConfig& c, int64_t shards, std::optional<double> activation_floats) {
  const double pages = static_cast<double>(sysconf(_SC_PHYS_PAGES));
  const double ram = pages * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const double model = estimated_training_bytes(c, shards, activation_floats);
  // Mostly a text corpus's text and ids; once the model is built, also its
  // parameters and the freed tensors kept for reuse, which the estimate
  // already counts.
  const double built = activation_floats ? 4 * model_footprint(c.model).parameters + Storage::cached_bytes() : 0;
  const double held = std::max(0.0, resident_bytes() - built);
  const double need = model + held;
  if (pages <= 0 || need <= ram) return;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  char buf[64];
  std::snprintf(buf, sizeof buf, "at least %.3g GiB, but this machine has %.3g GiB", need / gib, ram / gib);
  if (held > model) {
    char held_buf[32];
    std::snprintf(held_buf, sizeof held_buf, "%.3g GiB", held / gib);
    fail("this run needs ", buf, " of memory, ", held_buf, " of it already held for the data (data.path '",
         c.data.path, "' as text and token ids); ", prepare_advice(c.data.path));
  }
  fail("config: this run needs ", buf, " of memory (model.n_layer=", c.model.n_layer, ", model.n_embd=",
       c.model.n_embd, ", model.block_size=", c.model.block_size, ", train.batch_size=", c.train.batch_size,
       ", eval.iters=", c.eval.iters, ", eval.final_iters=", c.eval.final_iters,
       "); make the model, the batch or the evaluation smaller");
}

}  // namespace tapeformer
