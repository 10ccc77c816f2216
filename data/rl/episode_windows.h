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
  // Rows made by window() for each (episode, start), as one batch; a start
  // at or past the episode's end makes a row of padding only.
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

// Episodes read in order, K steps at a time, for a model with a segment
// memory: each of the B rows reads one episode from its first step, segment
// after segment; when the longest of the B has been read, the next B are
// drawn (uniformly from `episodes`) and restarted() says so, so that the
// memory starts empty with each episode (rows whose episode ended sooner
// read padding meanwhile). Batches as EpisodeWindows'.
class EpisodeStreams : public BatchSource {
 public:
  EpisodeStreams(const Trajectories& data, std::vector<int64_t> episodes, int64_t K, int64_t batch, uint64_t seed);
  Batch next() override;
  bool restarted() const override { return segment_ == 1; }
  // The segments of `group`'s episodes in order, as next() reads them (evaluation).
  std::vector<Batch> read(const std::vector<int64_t>& group) const;
  void save_position(cereal::BinaryOutputArchive& ar) const override;
  void load_position(cereal::BinaryInputArchive& ar) override;

 private:
  int64_t segments(const std::vector<int64_t>& group) const;  // ceil(longest / K)
  EpisodeWindows windows_;
  const Trajectories& data_;
  std::vector<int64_t> episodes_;
  int64_t K_, batch_;
  Rng rng_;
  std::vector<int64_t> group_;  // the episodes being read, one per row
  int64_t segment_ = 0;         // segments of group_ read so far
};

}  // namespace tapeformer
