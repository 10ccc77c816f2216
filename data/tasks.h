// Synthetic tasks for the papers' experiments (SPEC §8), generated from a seed.
//
//   CopyTask task({/*symbols=*/10, /*min_len=*/1, /*max_len=*/32}, /*batch=*/32, /*seed=*/1);
//   Batch b = task.next();   // inputs (32, 64), targets (32, 64) with kIgnoreTarget off the copy
//
// Copy (Katharopoulos et al. 2020 §4.1.1; SPEC E2a): a sequence `w SEP w`
// with |w| uniform in [min_len, max_len] over `symbols` symbols, then PAD up
// to 2 max_len + 1 tokens. Inputs are the sequence without its last token,
// targets the sequence shifted by one; only targets inside the second copy
// count (the rest are kIgnoreTarget), so the loss measures copying alone.
// Token ids: symbols 0..symbols-1, SEP = symbols, PAD = symbols + 1.
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "data/sampler.h"

namespace tapeformer {

struct CopyTaskConfig {
  int64_t symbols = 10;  // distinct symbols in w
  int64_t min_len = 1;   // shortest w
  int64_t max_len = 32;  // longest w
};

class CopyTask {
 public:
  // Throws Error naming the field unless 1 <= symbols, 1 <= min_len <= max_len, batch >= 1.
  CopyTask(const CopyTaskConfig& cfg, int64_t batch, uint64_t seed);

  Batch next();
  int64_t vocab_size() const { return cfg_.symbols + 2; }
  int64_t sequence_length() const { return 2 * cfg_.max_len; }  // T of inputs and targets
  int32_t sep() const { return static_cast<int32_t>(cfg_.symbols); }
  int32_t pad() const { return static_cast<int32_t>(cfg_.symbols + 1); }

  template <class Archive>
  void serialize(Archive& ar) {
    ar(rng_);
  }

 private:
  CopyTaskConfig cfg_;
  int64_t batch_;
  Rng rng_;
};

}  // namespace tapeformer
