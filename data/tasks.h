// Synthetic tasks for the papers' experiments (docs/math.md#experiments), generated from a seed.
//
//   CopyTask task({/*symbols=*/10, /*min_len=*/1, /*max_len=*/32}, /*batch=*/32, /*seed=*/1);
//   Batch b = task.next();   // inputs (32, 64), targets (32, 64) with kIgnoreTarget off the copy
//
// Copy (Katharopoulos et al. 2020 §4.1.1; E2a): a sequence `w SEP w`
// with |w| uniform in [min_len, max_len] over `symbols` symbols, then PAD up
// to 2 max_len + 1 tokens. Inputs are the sequence without its last token,
// targets the sequence shifted by one; only targets inside the second copy
// count (the rest are kIgnoreTarget), so the loss measures copying alone.
// Token ids: symbols 0..symbols-1, SEP = symbols, PAD = symbols + 1.
#pragma once

#include <cstdint>
#include <vector>

#include "tapeformer/core/rng.h"
#include "tapeformer/data/sampler.h"

namespace tapeformer {

struct CopyTaskConfig {
  int64_t symbols = 10;  // distinct symbols in w
  int64_t min_len = 1;   // shortest w
  int64_t max_len = 32;  // longest w
};

class CopyTask : public BatchSource {
 public:
  // Throws Error naming the field unless 1 <= symbols, 1 <= min_len <= max_len, batch >= 1.
  CopyTask(const CopyTaskConfig& cfg, int64_t batch, uint64_t seed);

  Batch next() override;
  int64_t vocab_size() const { return cfg_.symbols + 2; }
  int64_t sequence_length() const { return 2 * cfg_.max_len; }  // T of inputs and targets
  int32_t sep() const { return static_cast<int32_t>(cfg_.symbols); }
  int32_t pad() const { return static_cast<int32_t>(cfg_.symbols + 1); }

  void save_position(cereal::BinaryOutputArchive& ar) const override { ar(rng_); }
  void load_position(cereal::BinaryInputArchive& ar) override { ar(rng_); }

 private:
  CopyTaskConfig cfg_;
  int64_t batch_;
  Rng rng_;
};

// Recall across segments (E4c, docs/math.md#experiments): B endless streams read T tokens at a
// time, as a Transformer-XL reads its corpus. Every segment holds the marker
// KEY followed by a key symbol at a random place among filler symbols, and
// ends with the marker QUERY, whose target is the key of the segment
// `distance` segments earlier; no other target counts. Only a model that
// carries what it read across segments (a memory reaching distance * T
// positions back) beats the chance of 1 / keys.
// Token ids: filler 0..fillers-1, keys fillers..fillers+keys-1, then KEY, QUERY.
struct RecallTaskConfig {
  int64_t fillers = 16;   // distinct filler symbols
  int64_t keys = 8;       // distinct keys
  int64_t distance = 1;   // segments between a key and its query
  int64_t segment = 32;   // T
};

class RecallTask : public BatchSource {
 public:
  // Throws Error naming the field unless fillers, keys, distance >= 1 and segment >= 3.
  RecallTask(const RecallTaskConfig& cfg, int64_t batch, uint64_t seed);

  // The next segment of every stream: inputs (B, T), targets (B, T) with one
  // counted target per row (at the QUERY), none while fewer than `distance`
  // segments came before.
  Batch next() override;
  int64_t vocab_size() const { return cfg_.fillers + cfg_.keys + 2; }
  int32_t key_marker() const { return static_cast<int32_t>(cfg_.fillers + cfg_.keys); }
  int32_t query_marker() const { return key_marker() + 1; }
  // The generator, the segment count and every stream's pending keys.
  void save_position(cereal::BinaryOutputArchive& ar) const override;
  void load_position(cereal::BinaryInputArchive& ar) override;

 private:
  RecallTaskConfig cfg_;
  int64_t batch_;
  Rng rng_;
  int64_t segments_ = 0;                  // segments generated so far
  std::vector<std::vector<int32_t>> keys_;  // per stream, the keys of the last `distance` segments (oldest first)
};

}  // namespace tapeformer
