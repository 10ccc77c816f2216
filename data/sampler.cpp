#include "data/sampler.h"

#include "core/error.h"

namespace tapeformer {

RandomWindowSampler::RandomWindowSampler(const std::vector<int32_t>& tokens, int64_t batch, int64_t block,
                                         uint64_t seed, const std::string& what)
    : tokens_(&tokens), batch_(batch), block_(block), rng_(seed) {
  TAPEFORMER_CHECK(batch > 0 && block > 0, "RandomWindowSampler: batch ", batch, " and block ", block,
                   " must be positive");
  TAPEFORMER_CHECK(static_cast<int64_t>(tokens.size()) >= block + 1, "block size ", block, " needs at least ",
                   block + 1, " tokens, but the ", what, " has ", tokens.size(),
                   " (use a smaller model.block_size or more data)");
}

Batch RandomWindowSampler::next() {
  const int64_t starts = static_cast<int64_t>(tokens_->size()) - block_;  // windows of T+1 tokens
  std::vector<int32_t> x(batch_ * block_), y(batch_ * block_);
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t s = static_cast<int64_t>(rng_.below(static_cast<uint64_t>(starts)));
    for (int64_t t = 0; t < block_; ++t) {
      x[b * block_ + t] = (*tokens_)[s + t];
      y[b * block_ + t] = (*tokens_)[s + t + 1];
    }
  }
  ++drawn_;
  return {IndexTensor({batch_, block_}, std::move(x)), IndexTensor({batch_, block_}, std::move(y))};
}

}  // namespace tapeformer
