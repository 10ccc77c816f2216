#include "tapeformer/data/sampler.h"

#include <algorithm>

#include "tapeformer/core/error.h"

namespace tapeformer {

RandomWindowSampler::RandomWindowSampler(const TokenSource& tokens, int64_t batch, int64_t block, uint64_t seed,
                                         const std::string& what, int64_t align)
    : tokens_(&tokens), batch_(batch), block_(block), align_(align), rng_(seed) {
  check(what);
}

RandomWindowSampler::RandomWindowSampler(const std::vector<int32_t>& tokens, int64_t batch, int64_t block,
                                         uint64_t seed, const std::string& what, int64_t align)
    : owned_(std::make_shared<VectorTokens>(tokens)),
      tokens_(owned_.get()),
      batch_(batch),
      block_(block),
      align_(align),
      rng_(seed) {
  check(what);
}

void RandomWindowSampler::check(const std::string& what) const {
  TAPEFORMER_CHECK(batch_ > 0, "RandomWindowSampler: batch size must be >= 1, got ", batch_, " (", what, ")");
  TAPEFORMER_CHECK(block_ > 0, "RandomWindowSampler: block size must be >= 1, got ", block_, " (", what, ")");
  TAPEFORMER_CHECK(align_ >= 1, "RandomWindowSampler: align must be >= 1, got ", align_, " (", what, ")");
  TAPEFORMER_CHECK(tokens_->size() >= block_ + 1, "block size ", block_, " needs at least ", block_ + 1,
                   " tokens, but the ", what, " has ", tokens_->size(), " (use a smaller block size or more data)");
}

Batch window_batch(const TokenSource& tokens, const std::vector<int64_t>& starts, int64_t block) {
  const auto B = static_cast<int64_t>(starts.size());
  std::vector<int32_t> inputs(B * block), targets(B * block), window(static_cast<size_t>(block + 1));  // (B, T) each
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s = starts[b];
    TAPEFORMER_CHECK(s >= 0 && s + block < tokens.size(), "window start ", s, " out of range for block size ", block,
                     " in ", tokens.size(), " tokens");
    tokens.read(s, block + 1, window.data());
    std::copy(window.begin(), window.end() - 1, inputs.begin() + b * block);
    std::copy(window.begin() + 1, window.end(), targets.begin() + b * block);
  }
  return {IndexTensor({B, block}, std::move(inputs)), IndexTensor({B, block}, std::move(targets)), starts, {}};
}

Batch window_batch(const std::vector<int32_t>& tokens, const std::vector<int64_t>& starts, int64_t block) {
  return window_batch(VectorTokens(tokens), starts, block);
}

Batch RandomWindowSampler::next() {
  const auto windows = static_cast<uint64_t>(num_windows());
  std::vector<int64_t> starts(batch_);
  for (int64_t& s : starts) s = static_cast<int64_t>(rng_.below(windows)) * align_;  // in [0, n - T - 1]
  ++drawn_;
  return window_batch(*tokens_, starts, block_);
}

StreamSampler::StreamSampler(const TokenSource& tokens, int64_t batch, int64_t block, const std::string& what,
                             int64_t ext)
    : tokens_(&tokens), batch_(batch), block_(block), ext_(ext) {
  check(what);
}

StreamSampler::StreamSampler(const std::vector<int32_t>& tokens, int64_t batch, int64_t block, const std::string& what,
                             int64_t ext)
    : owned_(std::make_shared<VectorTokens>(tokens)), tokens_(owned_.get()), batch_(batch), block_(block), ext_(ext) {
  check(what);
}

void StreamSampler::check(const std::string& what) {
  stream_ = batch_ > 0 ? (tokens_->size() - 1) / batch_ : 0;
  TAPEFORMER_CHECK(ext_ >= 0, "StreamSampler: ext must be >= 0, got ", ext_, " (", what, ")");
  TAPEFORMER_CHECK(batch_ > 0, "StreamSampler: batch size must be >= 1, got ", batch_, " (", what, ")");
  TAPEFORMER_CHECK(block_ > 0, "StreamSampler: block size must be >= 1, got ", block_, " (", what, ")");
  TAPEFORMER_CHECK(stream_ >= block_, "block size ", block_, " in ", batch_, " streams needs at least ",
                   batch_ * block_ + 1, " tokens, but the ", what, " has ", tokens_->size(),
                   " (use a smaller block or batch size or more data)");
}

void StreamSampler::load_position(cereal::BinaryInputArchive& ar) {
  int64_t position = 0, drawn = 0;
  ar(position, drawn);
  TAPEFORMER_CHECK(position >= 0 && position <= stream_ && position % block_ == 0 && drawn >= 0,
                   "StreamSampler: position ", position, " is not a segment start of streams of ", stream_,
                   " tokens read ", block_, " at a time");
  position_ = position;
  drawn_ = drawn;
}

Batch StreamSampler::next() {
  if (position_ + block_ > stream_) position_ = 0;  // a stream ran out: start them all over
  const int64_t e = std::min(ext_, position_);  // tokens fed again before the segment
  std::vector<int64_t> starts(batch_);
  for (int64_t b = 0; b < batch_; ++b) starts[b] = b * stream_ + position_ - e;
  position_ += block_;
  ++drawn_;
  Batch batch = window_batch(*tokens_, starts, e + block_);
  for (int64_t b = 0; b < batch_; ++b)
    std::fill_n(batch.targets.data.begin() + b * (e + block_), e, kIgnoreTarget);
  return batch;
}

}  // namespace tapeformer
