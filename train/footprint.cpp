#include "tapeformer/train/footprint.h"

#include <cstdio>

#include <unistd.h>

#include "tapeformer/core/error.h"
#include "tapeformer/data/corpus.h"
#include "tapeformer/layers/language_model.h"

namespace tapeformer {

// A lower bound on a run's peak memory in bytes: parameters with their
// gradients (one per shard) and AdamW's two moments, the activations a step
// keeps for backward, and the evaluation batches. Parameters and activations
// come from the model's own footprint (its attention kind and positional
// scheme). For softmax attention it is below what was measured (about 4C +
// 1.3*H*T floats per token per layer for a 12-layer, 768-wide model at T =
// 256 and 1024, against 4C + H*T here), so a run that fits is never refused;
// the check exists to refuse, before allocating anything, configs that
// cannot fit at all.
double estimated_training_bytes(const TrainConfig& c, int64_t shards) {
  const ModelFootprint f = model_footprint(c.model);
  const double params = f.parameters;
  const double B = static_cast<double>(c.train.batch_size), T = static_cast<double>(c.model.block_size);
  const double eval_batches = (static_cast<double>(c.eval.iters) + static_cast<double>(c.eval.final_iters)) * B * T * 2;
  return 4 * (params * (3 + static_cast<double>(shards)) + B * f.activation_floats + eval_batches);
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

void check_fits_in_memory(const TrainConfig& c, int64_t shards) {
  const double pages = static_cast<double>(sysconf(_SC_PHYS_PAGES));
  const double ram = pages * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const double model = estimated_training_bytes(c, shards);
  const double held = resident_bytes();  // mostly a text corpus's text and ids
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
