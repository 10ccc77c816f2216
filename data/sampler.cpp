#include "data/sampler.h"

#include "core/error.h"

namespace tapeformer {

RandomWindowSampler::RandomWindowSampler(const std::vector<int32_t>& tokens, int64_t batch, int64_t block,
                                         uint64_t seed, const std::string& what)
    : tokens_(&tokens), batch_(batch), block_(block), rng_(seed) {
  TAPEFORMER_CHECK(batch > 0, "RandomWindowSampler: batch size must be >= 1, got ", batch, " (", what, ")");
  TAPEFORMER_CHECK(block > 0, "RandomWindowSampler: block size must be >= 1, got ", block, " (", what, ")");
  TAPEFORMER_CHECK(static_cast<int64_t>(tokens.size()) >= block + 1, "block size ", block, " needs at least ",
                   block + 1, " tokens, but the ", what, " has ", tokens.size(),
                   " (use a smaller block size or more data)");
}

Batch RandomWindowSampler::next() {
  const auto windows = static_cast<uint64_t>(num_windows());
  const int32_t* x = tokens_->data();
  std::vector<int32_t> inputs(batch_ * block_), targets(batch_ * block_);  // (B, T) each
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t s = static_cast<int64_t>(rng_.below(windows));  // in [0, n - T - 1]
    for (int64_t t = 0; t < block_; ++t) {
      inputs[b * block_ + t] = x[s + t];
      targets[b * block_ + t] = x[s + t + 1];
    }
  }
  ++drawn_;
  return {IndexTensor({batch_, block_}, std::move(inputs)), IndexTensor({batch_, block_}, std::move(targets))};
}

}  // namespace tapeformer
