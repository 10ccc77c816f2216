// Windows of K steps of a dataset's episodes, as a Decision Transformer
// reads them (layers/models/decision_transformer.h): the batch source of
// `tapeformer rl train`.
//
//   EpisodeWindows train(data, train_episodes, /*K=*/20, /*batch=*/64, /*seed=*/1);
//   Batch b = train.next();   // inputs: previous actions (B, K); targets: actions (B, K);
//                             // extra: "states" (B, K, F), "returns" (B, K), "timesteps" (B, K)
//
// A window starts at a step drawn uniformly over all the episodes' steps (an
// episode is drawn in proportion to its length, as the paper's code does)
// and runs K steps or to the episode's end; a shorter window is padded on
// the right, where the causal model never looks back from a real step, and
// its padded targets are kIgnoreTarget. ids[t] is the action before step t
// in the episode (`actions`, the start token, at its first step); returns[t]
// is the sum of the episode's rewards from step t on.
#pragma once

#include <cstdint>
#include <vector>

#include "tapeformer/core/rng.h"
#include "tapeformer/data/rl/trajectories.h"
#include "tapeformer/data/sampler.h"

namespace tapeformer {

class EpisodeWindows : public BatchSource {
 public:
  // `data` must outlive the source; `episodes` are the indices it draws from.
  EpisodeWindows(const Trajectories& data, std::vector<int64_t> episodes, int64_t K, int64_t batch, uint64_t seed);
  Batch next() override;
  // The window of `episode` from `start`: one row.
  Batch window(int64_t episode, int64_t start) const;
  // Rows made by window() for each (episode, start), as one batch.
  Batch windows(const std::vector<std::pair<int64_t, int64_t>>& at) const;
  void save_position(cereal::BinaryOutputArchive& ar) const override { ar(rng_); }
  void load_position(cereal::BinaryInputArchive& ar) override { ar(rng_); }

 private:
  const Trajectories& data_;
  std::vector<int64_t> episodes_;
  std::vector<int64_t> ends_;  // cumulative steps of episodes_
  int64_t K_, batch_;
  Rng rng_;
};

}  // namespace tapeformer
