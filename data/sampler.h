// RandomWindowSampler: GPT-style batches of random windows (nanoGPT get_batch).
//
//   RandomWindowSampler s(corpus.train(), /*B=*/12, /*T=*/64, /*seed=*/1, "train split");
//   Batch b = s.next();   // b.inputs (B, T) = x[s, s+T), b.targets (B, T) = x[s+1, s+T]
//
// Each call draws B start offsets s independently and uniformly from
// [0, n - T - 1], i.e. every window of T + 1 tokens that fits in the n tokens
// (nanoGPT: torch.randint(len(data) - block_size, (batch_size,))). Offsets
// come from the sampler's own Rng, so batches depend only on the seed and on
// how many batches were drawn before.
//
// Persistence: save_position stores (Rng state, batches drawn); a sampler
// that loads it, built over the same tokens, B and T, continues with exactly
// the batches the original would have drawn next.
#pragma once

#include <cereal/archives/binary.hpp>
#include <cereal/types/array.hpp>  // Rng's state words, so callers need no extra include
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/core/rng.h"
#include "tapeformer/core/tensor.h"
#include "tapeformer/data/token_file.h"

namespace tapeformer {

// A target that does not count in the loss (cross_entropy's default ignore_index).
inline constexpr int32_t kIgnoreTarget = -100;

struct Batch {
  IndexTensor inputs;   // (B, T) token ids
  IndexTensor targets;  // (B, T) the next token after each input position (or kIgnoreTarget)
  // (B): where each row's first input lies in the tokens it was read from
  // (window_batch fills it; empty when the source does not say).
  std::vector<int64_t> starts;
  // Inputs beside the ids a model kind reads, by name, each (B, T, ...):
  // SPALM's "retrieved" tokens (B, T, K), added by its batch source
  // (train/hooks/spalm.h); empty for the others.
  std::map<std::string, IndexTensor> extra;
};

// BatchSource: where a training loop's batches come from. Random windows and
// ordered streams (below) and the synthetic tasks (data/tasks.h) each are
// one; the Trainer and train_step read them through next().
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch next() = 0;  // inputs and targets (B, T)
  // Whether the batch last returned starts the data over, so that a memory
  // carried from the one before must be cleared (ordered streams).
  virtual bool restarted() const { return false; }
  // The source's position, for checkpoints: a source built alike that loads
  // it returns exactly the batches this one would return next. load_position
  // throws (cereal's or Error) on a short or inconsistent archive.
  virtual void save_position(cereal::BinaryOutputArchive& ar) const = 0;
  virtual void load_position(cereal::BinaryInputArchive& ar) = 0;
};

// The batch of windows starting at `starts` (one row each): inputs
// x[s, s+T), targets x[s+1, s+T]. Throws Error for a start whose window of
// T + 1 tokens does not fit in `tokens`.
Batch window_batch(const TokenSource& tokens, const std::vector<int64_t>& starts, int64_t block);
Batch window_batch(const std::vector<int32_t>& tokens, const std::vector<int64_t>& starts, int64_t block);

class RandomWindowSampler : public BatchSource {
 public:
  // `tokens` must outlive the sampler; `what` names them in errors. Throws
  // Error unless batch >= 1, block >= 1 and tokens.size() >= block + 1:
  //   block size 64 needs at least 65 tokens, but the val split has 40 (...)
  // With align > 1, windows start only at multiples of it (fixed-length records).
  RandomWindowSampler(const TokenSource& tokens, int64_t batch, int64_t block, uint64_t seed, const std::string& what,
                      int64_t align = 1);
  RandomWindowSampler(const std::vector<int32_t>& tokens, int64_t batch, int64_t block, uint64_t seed,
                      const std::string& what, int64_t align = 1);

  Batch next() override;
  int64_t drawn() const { return drawn_; }  // batches returned by next() so far
  int64_t batch_size() const { return batch_; }
  int64_t block_size() const { return block_; }
  // Number of distinct start offsets: n - T, or with align a, (n - T - 1) / a + 1.
  int64_t num_windows() const { return align_ > 1 ? (tokens_->size() - block_ - 1) / align_ + 1 : tokens_->size() - block_; }

  void save_position(cereal::BinaryOutputArchive& ar) const override { ar(rng_, drawn_); }
  void load_position(cereal::BinaryInputArchive& ar) override { ar(rng_, drawn_); }

 private:
  void check(const std::string& what) const;
  std::shared_ptr<const TokenSource> owned_;  // a vector's wrapper, when built from one
  const TokenSource* tokens_;
  int64_t batch_, block_, align_;
  Rng rng_;
  int64_t drawn_ = 0;
};

// StreamSampler: Transformer-XL's ordered batches (docs/math.md#segment-memory). The tokens are
// cut into B contiguous streams of L = (n - 1) / B tokens; each call returns
// the next T positions of every stream, so row b of a batch continues row b of
// the previous one (what a segment memory needs):
//
//   StreamSampler s(corpus.train(), /*B=*/16, /*T=*/64, "train split");
//   Batch b = s.next();   // row r: x[r L + p, r L + p + T), targets one further
//   if (s.restarted()) memory.reset();   // this batch went back to the streams' starts
//
// When fewer than T positions are left in a stream, the next batch starts the
// streams over (restarted() is true for it, and for the first batch).
// With ext > 0 (Transformer-XL's ext_len) each batch also starts with the
// up to `ext` tokens before its segment, fed again, their targets
// kIgnoreTarget: inputs (B, e + T), e = min(ext, tokens read in this pass).
class StreamSampler : public BatchSource {
 public:
  // `tokens` must outlive the sampler; `what` names them in errors. Throws
  // Error unless batch >= 1, block >= 1, ext >= 0 and every stream holds a segment.
  StreamSampler(const TokenSource& tokens, int64_t batch, int64_t block, const std::string& what, int64_t ext = 0);
  StreamSampler(const std::vector<int32_t>& tokens, int64_t batch, int64_t block, const std::string& what,
                int64_t ext = 0);

  Batch next() override;
  // Whether the batch last returned began at the streams' starts.
  bool restarted() const override { return position_ == block_; }
  int64_t drawn() const { return drawn_; }
  int64_t stream_length() const { return stream_; }
  // Segments per pass over the streams.
  int64_t segments() const { return stream_ / block_; }

  void save_position(cereal::BinaryOutputArchive& ar) const override { ar(position_, drawn_); }
  void load_position(cereal::BinaryInputArchive& ar) override;  // checks the position fits the streams

 private:
  void check(const std::string& what);
  std::shared_ptr<const TokenSource> owned_;
  const TokenSource* tokens_;
  int64_t batch_, block_, stream_ = 0, ext_;
  int64_t position_ = 0;  // where the next batch starts in each stream
  int64_t drawn_ = 0;
};

}  // namespace tapeformer
