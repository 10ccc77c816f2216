// RandomWindowSampler: GPT-style batches of random windows (nanoGPT get_batch).
//
//   RandomWindowSampler s(corpus.train(), /*B=*/12, /*T=*/64, /*seed=*/1, "train split");
//   Batch b = s.next();   // b.inputs (B, T) = x[i, i+T), b.targets (B, T) = x[i+1, i+T]
//
// Start offsets are uniform over every window of T+1 tokens. The state (its
// own Rng and the number of batches drawn) serialises with cereal, so a
// restored sampler continues with exactly the same batches.
#pragma once

#include <string>
#include <vector>

#include "core/rng.h"

namespace tapeformer {

struct Batch {
  IndexTensor inputs;   // (B, T)
  IndexTensor targets;  // (B, T)
};

class RandomWindowSampler {
 public:
  // tokens must outlive the sampler; `what` names the data in errors.
  RandomWindowSampler(const std::vector<int32_t>& tokens, int64_t batch, int64_t block, uint64_t seed,
                      const std::string& what);
  Batch next();
  int64_t drawn() const { return drawn_; }

  template <class Archive>
  void serialize(Archive& ar) {
    ar(rng_, drawn_);
  }

 private:
  const std::vector<int32_t>* tokens_;
  int64_t batch_, block_;
  Rng rng_;
  int64_t drawn_ = 0;
};

}  // namespace tapeformer
