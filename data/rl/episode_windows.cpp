#include "tapeformer/data/rl/episode_windows.h"

#include <algorithm>
#include <string>
#include <utility>

#include <cereal/types/vector.hpp>

#include "tapeformer/core/error.h"
#include "tapeformer/core/serialize.h"

namespace tapeformer {

EpisodeWindows::EpisodeWindows(const Trajectories& data, std::vector<int64_t> episodes, int64_t K, int64_t batch,
                               uint64_t seed)
    : data_(data), episodes_(std::move(episodes)), K_(K), batch_(batch), rng_(seed) {
  TAPEFORMER_CHECK(K >= 1 && batch >= 1, "EpisodeWindows: K and the batch must be >= 1, got ", K, " and ", batch);
  TAPEFORMER_CHECK(!episodes_.empty(), "EpisodeWindows: no episodes to draw from");
  int64_t total = 0;
  for (int64_t e : episodes_) {
    TAPEFORMER_CHECK(e >= 0 && e < static_cast<int64_t>(data.episodes.size()), "EpisodeWindows: episode ", e,
                     " of ", data.episodes.size());
    total += static_cast<int64_t>(data.episodes[static_cast<size_t>(e)].actions.size());
    ends_.push_back(total);
  }
}

Batch EpisodeWindows::windows(const std::vector<std::pair<int64_t, int64_t>>& at) const {
  const auto B = static_cast<int64_t>(at.size()), F = static_cast<int64_t>(data_.feature_sizes.size());
  std::vector<int32_t> ids(static_cast<size_t>(B * K_), data_.actions), targets(ids.size(), kIgnoreTarget),
      returns(ids.size(), 0), time(ids.size(), 0), states(static_cast<size_t>(B * K_ * F), 0);
  for (int64_t b = 0; b < B; ++b) {
    const auto [e, start] = at[static_cast<size_t>(b)];
    const Episode& ep = data_.episodes[static_cast<size_t>(e)];
    const auto T = static_cast<int64_t>(ep.actions.size());
    TAPEFORMER_CHECK(start >= 0, "EpisodeWindows: step ", start, " of an episode of ", T);
    int64_t to_come = 0;
    for (int64_t t = start; t < T; ++t) to_come += ep.rewards[static_cast<size_t>(t)];
    for (int64_t k = 0; k < K_ && start + k < T; ++k) {
      const int64_t t = start + k;
      const auto i = static_cast<size_t>(b * K_ + k);
      ids[i] = t == 0 ? data_.actions : ep.actions[static_cast<size_t>(t - 1)];
      targets[i] = ep.actions[static_cast<size_t>(t)];
      returns[i] = static_cast<int32_t>(to_come);
      to_come -= ep.rewards[static_cast<size_t>(t)];
      time[i] = static_cast<int32_t>(t);
      std::copy(ep.observations[static_cast<size_t>(t)].begin(), ep.observations[static_cast<size_t>(t)].end(),
                states.begin() + static_cast<int64_t>(i) * F);
    }
  }
  Batch batch{IndexTensor({B, K_}, ids), IndexTensor({B, K_}, targets), {}, {}};
  batch.extra = {{"states", IndexTensor({B, K_, F}, states)}, {"returns", IndexTensor({B, K_}, returns)},
                 {"timesteps", IndexTensor({B, K_}, time)}};
  return batch;
}

Batch EpisodeWindows::window(int64_t episode, int64_t start) const {
  const size_t T = data_.episodes.at(static_cast<size_t>(episode)).actions.size();
  TAPEFORMER_CHECK(start >= 0 && start < static_cast<int64_t>(T), "EpisodeWindows: step ", start, " of an episode of ",
                   T);
  return windows({{episode, start}});
}

Batch EpisodeWindows::next() {
  std::vector<std::pair<int64_t, int64_t>> at;
  for (int64_t b = 0; b < batch_; ++b) {
    const auto step = static_cast<int64_t>(rng_.below(static_cast<uint64_t>(ends_.back())));
    const size_t j = static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), step) - ends_.begin());
    const int64_t before = j == 0 ? 0 : ends_[j - 1];
    at.emplace_back(episodes_[j], step - before);
  }
  return windows(at);
}

}  // namespace tapeformer

namespace tapeformer {

EpisodeStreams::EpisodeStreams(const Trajectories& data, std::vector<int64_t> episodes, int64_t K, int64_t batch,
                               uint64_t seed)
    : windows_(data, episodes, K, batch, seed), data_(data), episodes_(std::move(episodes)), K_(K), batch_(batch),
      rng_(seed) {}

int64_t EpisodeStreams::segments(const std::vector<int64_t>& group) const {
  size_t longest = 0;
  for (int64_t e : group) longest = std::max(longest, data_.episodes[static_cast<size_t>(e)].actions.size());
  return (static_cast<int64_t>(longest) + K_ - 1) / K_;
}

Batch EpisodeStreams::next() {
  if (group_.empty() || segment_ == segments(group_)) {
    group_.clear();
    for (int64_t b = 0; b < batch_; ++b)
      group_.push_back(episodes_[static_cast<size_t>(rng_.below(static_cast<uint64_t>(episodes_.size())))]);
    segment_ = 0;
  }
  std::vector<std::pair<int64_t, int64_t>> at;
  for (int64_t e : group_) at.emplace_back(e, segment_ * K_);
  ++segment_;
  return windows_.windows(at);
}

std::vector<Batch> EpisodeStreams::read(const std::vector<int64_t>& group) const {
  std::vector<Batch> out;
  for (int64_t s = 0; s < segments(group); ++s) {
    std::vector<std::pair<int64_t, int64_t>> at;
    for (int64_t e : group) at.emplace_back(e, s * K_);
    out.push_back(windows_.windows(at));
  }
  return out;
}

void EpisodeStreams::save_position(cereal::BinaryOutputArchive& ar) const { ar(rng_, group_, segment_); }

void EpisodeStreams::load_position(cereal::BinaryInputArchive& ar) {
  ar(rng_);
  read_bounded(ar, group_, static_cast<uint64_t>(batch_), "EpisodeStreams: the position's rows");
  ar(segment_);
  TAPEFORMER_CHECK(group_.empty() || static_cast<int64_t>(group_.size()) == batch_, "EpisodeStreams: a position of ",
                   group_.size(), " rows for a batch of ", batch_);
  for (int64_t e : group_)
    TAPEFORMER_CHECK(std::find(episodes_.begin(), episodes_.end(), e) != episodes_.end(), "EpisodeStreams: the "
                     "position's episode ", e, " is not one this source reads");
  TAPEFORMER_CHECK(segment_ >= 0 && segment_ <= (group_.empty() ? 0 : segments(group_)), "EpisodeStreams: segment ",
                   segment_, " of the position is past its episodes");
}

}  // namespace tapeformer
