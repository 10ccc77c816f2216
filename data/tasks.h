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
// Reversal (the Universal Transformer's algorithmic tasks, Dehghani et al.
// 2019): `w SEP reverse(w)`, the same in every other respect.
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
  bool reverse = false;  // the second copy reversed
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

// Associative recall across segments (the Memorizing Transformer's
// experiment, docs/math.md#experiments): B endless streams read T tokens at a
// time. Every segment states `facts` facts `KEY v n` (a value v bound to a
// name n), each at a random place in its own stretch of filler symbols, and
// ends with two queries `QUERY n'`, whose target (at n') is the value bound
// to n':
//   ... KEY v1 n1 ... KEY v2 n2 ... QUERY n v? QUERY m v?
//   local query: n, one of the names stated in this segment (answerable by a
//                model that attends within its segment, matching names: a
//                segment holds several facts, so no heuristic finds the value);
//   far query:   m, one of the names stated `distance` segments earlier
//                (with max_distance > distance: a distance drawn uniformly
//                from [distance, max_distance] per stream and segment).
// The value comes before its name, so the name's own position can hold both
// (one attention step back), and a query finds it by the name alone.
// Two statements of a name lie at least names / 2 facts apart: the binding a
// query asks for is the only one of its name within that span, so a memory
// searched by content (not by position) can single it out. Both targets
// count in the loss; "recall" scores the far query alone.
// Token ids: filler 0..fillers-1, names next, then values, then KEY, QUERY.
struct AssociativeRecallConfig {
  int64_t fillers = 16;  // distinct filler symbols
  int64_t names = 128;   // distinct names; a name is stated again at the earliest names / 2 facts later
  int64_t values = 16;   // distinct values: chance is 1 / values
  int64_t facts = 2;     // facts per segment
  int64_t distance = 1;  // segments between a fact and its far query; distance * facts < names / 2
  int64_t max_distance = 0;  // > distance: each far query's distance drawn from [distance, max_distance]; 0: fixed
  int64_t segment = 32;  // T, >= 4 + 3 facts
};

class AssociativeRecallTask : public BatchSource {
 public:
  // Throws Error naming the field unless fillers, values, facts >= 1,
  // names >= 4, 1 <= distance with distance * facts < names / 2, max_distance
  // 0 or in [distance, names / 2 / facts) alike, and segment >= 4 + 3 facts.
  AssociativeRecallTask(const AssociativeRecallConfig& cfg, int64_t batch, uint64_t seed);

  // The next segment of every stream: inputs (B, T), targets (B, T) with the
  // local query's target at T - 3 and the far query's at T - 1 (ignored
  // while fewer than its distance's segments came before). Fact i lies in
  // positions [i s, (i + 1) s) with s = (T - 4) / facts.
  Batch next() override;
  int64_t vocab_size() const { return cfg_.fillers + cfg_.names + cfg_.values + 2; }
  int32_t key_marker() const { return static_cast<int32_t>(cfg_.fillers + cfg_.names + cfg_.values); }
  int32_t query_marker() const { return key_marker() + 1; }
  static constexpr int64_t kLocalQuery = 3, kFarQuery = 1;  // targets at T - 3 and T - 1
  // The generator and every stream's recent facts.
  void save_position(cereal::BinaryOutputArchive& ar) const override;
  void load_position(cereal::BinaryInputArchive& ar) override;

 private:
  struct Fact {
    int32_t name = 0, value = 0;
  };
  AssociativeRecallConfig cfg_;
  int64_t batch_;
  Rng rng_;
  std::vector<std::vector<Fact>> recent_;  // per stream, the last names / 2 - 1 facts stated (oldest first)
};

}  // namespace tapeformer
