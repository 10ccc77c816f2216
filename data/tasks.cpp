#include "tapeformer/data/tasks.h"

#include <algorithm>
#include <vector>

#include "tapeformer/core/error.h"

namespace tapeformer {

CopyTask::CopyTask(const CopyTaskConfig& cfg, int64_t batch, uint64_t seed) : cfg_(cfg), batch_(batch), rng_(seed) {
  TAPEFORMER_CHECK(cfg.symbols >= 1 && cfg.symbols <= (1 << 20), "CopyTask: symbols must be in [1, 2^20], got ",
                   cfg.symbols);
  TAPEFORMER_CHECK(cfg.min_len >= 1 && cfg.min_len <= cfg.max_len && cfg.max_len <= (1 << 20),
                   "CopyTask: lengths must satisfy 1 <= min_len (", cfg.min_len, ") <= max_len (", cfg.max_len,
                   ") <= 2^20");
  TAPEFORMER_CHECK(batch >= 1, "CopyTask: batch size must be >= 1, got ", batch);
}

Batch CopyTask::next() {
  const int64_t T = sequence_length(), span = cfg_.max_len - cfg_.min_len + 1;
  std::vector<int32_t> inputs(static_cast<size_t>(batch_ * T)), targets(inputs.size());  // (B, T) each
  std::vector<int32_t> seq(static_cast<size_t>(T + 1));
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t L = cfg_.min_len + static_cast<int64_t>(rng_.below(static_cast<uint64_t>(span)));
    std::fill(seq.begin(), seq.end(), pad());
    for (int64_t i = 0; i < L; ++i) {
      seq[static_cast<size_t>(i)] = static_cast<int32_t>(rng_.below(static_cast<uint64_t>(cfg_.symbols)));
    }
    for (int64_t i = 0; i < L; ++i)  // the copy, in order or reversed
      seq[static_cast<size_t>(L + 1 + i)] = seq[static_cast<size_t>(cfg_.reverse ? L - 1 - i : i)];
    seq[static_cast<size_t>(L)] = sep();
    for (int64_t t = 0; t < T; ++t) {
      inputs[static_cast<size_t>(b * T + t)] = seq[static_cast<size_t>(t)];
      // Position t predicts seq[t + 1]: it counts when that is in the second copy (t in [L, 2L)).
      targets[static_cast<size_t>(b * T + t)] = t >= L && t < 2 * L ? seq[static_cast<size_t>(t + 1)] : kIgnoreTarget;
    }
  }
  return {IndexTensor({batch_, T}, std::move(inputs)), IndexTensor({batch_, T}, std::move(targets)), {}, {}};
}

RecallTask::RecallTask(const RecallTaskConfig& cfg, int64_t batch, uint64_t seed)
    : cfg_(cfg), batch_(batch), rng_(seed), keys_(static_cast<size_t>(std::max<int64_t>(batch, 0))) {
  TAPEFORMER_CHECK(cfg.fillers >= 1 && cfg.fillers <= (1 << 20), "RecallTask: fillers must be in [1, 2^20], got ",
                   cfg.fillers);
  TAPEFORMER_CHECK(cfg.keys >= 1 && cfg.keys <= (1 << 20), "RecallTask: keys must be in [1, 2^20], got ", cfg.keys);
  TAPEFORMER_CHECK(cfg.distance >= 1 && cfg.distance <= (1 << 20), "RecallTask: distance must be in [1, 2^20], got ",
                   cfg.distance);
  TAPEFORMER_CHECK(cfg.segment >= 3 && cfg.segment <= (1 << 20), "RecallTask: segment must be in [3, 2^20], got ",
                   cfg.segment);
  TAPEFORMER_CHECK(batch >= 1, "RecallTask: batch size must be >= 1, got ", batch);
}

Batch RecallTask::next() {
  const int64_t T = cfg_.segment;
  std::vector<int32_t> inputs(static_cast<size_t>(batch_ * T)), targets(inputs.size(), kIgnoreTarget);  // (B, T)
  for (int64_t b = 0; b < batch_; ++b) {
    int32_t* row = inputs.data() + b * T;
    for (int64_t t = 0; t < T; ++t) row[t] = static_cast<int32_t>(rng_.below(static_cast<uint64_t>(cfg_.fillers)));
    const auto p = static_cast<int64_t>(rng_.below(static_cast<uint64_t>(T - 2)));  // KEY at p, its key at p + 1
    const auto key = static_cast<int32_t>(cfg_.fillers + static_cast<int64_t>(rng_.below(static_cast<uint64_t>(cfg_.keys))));
    row[p] = key_marker();
    row[p + 1] = key;
    row[T - 1] = query_marker();
    std::vector<int32_t>& past = keys_[static_cast<size_t>(b)];
    if (static_cast<int64_t>(past.size()) == cfg_.distance) {
      targets[static_cast<size_t>(b * T + T - 1)] = past.front();  // the key `distance` segments back
      past.erase(past.begin());
    }
    past.push_back(key);
  }
  ++segments_;
  return {IndexTensor({batch_, T}, std::move(inputs)), IndexTensor({batch_, T}, std::move(targets)), {}, {}};
}

void RecallTask::save_position(cereal::BinaryOutputArchive& ar) const {
  ar(rng_, segments_);
  for (const std::vector<int32_t>& past : keys_) {
    ar(static_cast<uint64_t>(past.size()));
    for (int32_t k : past) ar(k);
  }
}

void RecallTask::load_position(cereal::BinaryInputArchive& ar) {
  ar(rng_, segments_);
  TAPEFORMER_CHECK(segments_ >= 0, "RecallTask: a segment count of ", segments_);
  for (std::vector<int32_t>& past : keys_) {
    uint64_t n = 0;
    ar(n);
    TAPEFORMER_CHECK(n <= static_cast<uint64_t>(cfg_.distance), "RecallTask: ", n, " pending keys, more than the ",
                     cfg_.distance, " segments a query looks back");
    past.resize(static_cast<size_t>(n));
    for (int32_t& k : past) {
      ar(k);
      TAPEFORMER_CHECK(k >= cfg_.fillers && k < cfg_.fillers + cfg_.keys, "RecallTask: a pending key ", k,
                       " outside the key ids [", cfg_.fillers, ", ", cfg_.fillers + cfg_.keys, ")");
    }
  }
}

AssociativeRecallTask::AssociativeRecallTask(const AssociativeRecallConfig& cfg, int64_t batch, uint64_t seed)
    : cfg_(cfg), batch_(batch), rng_(seed), recent_(static_cast<size_t>(std::max<int64_t>(batch, 0))) {
  TAPEFORMER_CHECK(cfg.fillers >= 1 && cfg.fillers <= (1 << 20),
                   "AssociativeRecallTask: fillers must be in [1, 2^20], got ", cfg.fillers);
  TAPEFORMER_CHECK(cfg.names >= 4 && cfg.names <= (1 << 20), "AssociativeRecallTask: names must be in [4, 2^20], got ",
                   cfg.names);
  TAPEFORMER_CHECK(cfg.values >= 1 && cfg.values <= (1 << 20),
                   "AssociativeRecallTask: values must be in [1, 2^20], got ", cfg.values);
  TAPEFORMER_CHECK(cfg.facts >= 1 && cfg.facts <= (1 << 10), "AssociativeRecallTask: facts must be in [1, 2^10], got ",
                   cfg.facts);
  TAPEFORMER_CHECK(cfg.distance >= 1 && cfg.distance * cfg.facts < cfg.names / 2, "AssociativeRecallTask: distance ",
                   cfg.distance, " x facts ", cfg.facts, " must be in [1, ", cfg.names / 2,
                   ") (names / 2, the facts within which no name repeats)");
  TAPEFORMER_CHECK(cfg.max_distance == 0 || (cfg.max_distance >= cfg.distance && cfg.max_distance * cfg.facts < cfg.names / 2),
                   "AssociativeRecallTask: max_distance ", cfg.max_distance, " must be 0 (fixed) or in [distance ",
                   cfg.distance, ", ", (cfg.names / 2 + cfg.facts - 1) / cfg.facts,
                   ") (max_distance x facts below names / 2)");
  TAPEFORMER_CHECK(cfg.segment >= 4 + 3 * cfg.facts && cfg.segment <= (1 << 20), "AssociativeRecallTask: segment must be in [",
                   4 + 3 * cfg.facts, ", 2^20] (4 + 3 facts), got ", cfg.segment);
  TAPEFORMER_CHECK(batch >= 1, "AssociativeRecallTask: batch size must be >= 1, got ", batch);
}

Batch AssociativeRecallTask::next() {
  const int64_t T = cfg_.segment, F = cfg_.facts, stretch = (T - 4) / F, kept = cfg_.names / 2 - 1;
  const auto first_name = static_cast<int32_t>(cfg_.fillers), first_value = static_cast<int32_t>(cfg_.fillers + cfg_.names);
  const auto draw = [&](int64_t n) { return static_cast<int64_t>(rng_.below(static_cast<uint64_t>(n))); };
  std::vector<int32_t> inputs(static_cast<size_t>(batch_ * T)), targets(inputs.size(), kIgnoreTarget);  // (B, T)
  for (int64_t b = 0; b < batch_; ++b) {
    int32_t* row = inputs.data() + b * T;
    int32_t* want = targets.data() + b * T;
    for (int64_t t = 0; t < T; ++t) row[t] = static_cast<int32_t>(draw(cfg_.fillers));
    std::vector<Fact>& recent = recent_[static_cast<size_t>(b)];
    // The fact `distance` segments back that the far query asks for (none yet while too few came).
    const int64_t distance =
        cfg_.max_distance > cfg_.distance ? cfg_.distance + draw(cfg_.max_distance - cfg_.distance + 1) : cfg_.distance;
    const int64_t far_at = static_cast<int64_t>(recent.size()) - distance * F;
    const Fact far = far_at >= 0 ? recent[static_cast<size_t>(far_at + draw(F))] : Fact{};
    for (int64_t i = 0; i < F; ++i) {
      // A name none of the last names / 2 - 1 facts stated.
      Fact fact;
      do {
        fact.name = first_name + static_cast<int32_t>(draw(cfg_.names));
      } while (std::any_of(recent.begin(), recent.end(), [&](const Fact& f) { return f.name == fact.name; }));
      fact.value = first_value + static_cast<int32_t>(draw(cfg_.values));
      const int64_t p = i * stretch + draw(stretch - 2);  // KEY v n at p .. p + 2, inside stretch i
      row[p] = key_marker();
      row[p + 1] = fact.value;
      row[p + 2] = fact.name;
      recent.push_back(fact);
      if (static_cast<int64_t>(recent.size()) > kept) recent.erase(recent.begin());
    }
    const Fact& local = recent[recent.size() - static_cast<size_t>(F) + static_cast<size_t>(draw(F))];
    row[T - 4] = query_marker();
    row[T - 3] = local.name;
    want[T - 3] = local.value;
    row[T - 2] = query_marker();
    row[T - 1] = far_at >= 0 ? far.name : first_name + static_cast<int32_t>(draw(cfg_.names));
    if (far_at >= 0) want[T - 1] = far.value;
  }
  return {IndexTensor({batch_, T}, std::move(inputs)), IndexTensor({batch_, T}, std::move(targets)), {}, {}};
}

void AssociativeRecallTask::save_position(cereal::BinaryOutputArchive& ar) const {
  ar(rng_);
  for (const std::vector<Fact>& recent : recent_) {
    ar(static_cast<uint64_t>(recent.size()));
    for (const Fact& f : recent) ar(f.name, f.value);
  }
}

void AssociativeRecallTask::load_position(cereal::BinaryInputArchive& ar) {
  ar(rng_);
  const int64_t first_name = cfg_.fillers, first_value = cfg_.fillers + cfg_.names;
  for (std::vector<Fact>& recent : recent_) {
    uint64_t n = 0;
    ar(n);
    TAPEFORMER_CHECK(n < static_cast<uint64_t>(cfg_.names / 2), "AssociativeRecallTask: ", n,
                     " recent facts, more than the ", cfg_.names / 2 - 1, " (names / 2 - 1) it keeps");
    recent.resize(static_cast<size_t>(n));
    for (Fact& f : recent) {
      ar(f.name, f.value);
      TAPEFORMER_CHECK(f.name >= first_name && f.name < first_value && f.value >= first_value &&
                           f.value < first_value + cfg_.values,
                       "AssociativeRecallTask: a recent fact (", f.name, ", ", f.value, ") outside the name ids [",
                       first_name, ", ", first_value, ") or value ids [", first_value, ", ", first_value + cfg_.values,
                       ")");
    }
  }
}

}  // namespace tapeformer
