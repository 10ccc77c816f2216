// The independent random streams of a run, all from train.seed: stream k's
// seed is train.seed * 1000003 + k (a large odd multiplier, so that the
// streams of neighbouring seeds never meet).
//
//   Rng init(stream_seed(cfg.train.seed, Stream::init));
//   CopyTask batches(task_cfg, B, stream_seed(cfg.train.seed, TaskStream::batches));
#pragma once

#include <cstdint>

namespace tapeformer {

// A run on a text: the Trainer's streams.
enum class Stream : uint64_t {
  init = 0,           // the model's initial weights (every run)
  dropout = 1,        // dropout draws
  train_batches = 2,  // training windows
  val_batches = 3,    // the periodic evaluations' windows
  final_batches = 4,  // the final evaluation's windows
};

// A run on a task (TaskData: a program's own batches; `rl train`, the
// examples): its streams beside the Trainer's initial weights.
enum class TaskStream : uint64_t {
  batches = 1,           // training batches
  evaluation = 2,        // evaluation batches
  dropout = 3,           // dropout draws (TaskData::dropout_seed)
  final_evaluation = 4,  // the final evaluation's batches, where they differ
};

inline uint64_t stream_seed(int64_t seed, uint64_t stream) { return static_cast<uint64_t>(seed) * 1000003ULL + stream; }
inline uint64_t stream_seed(int64_t seed, Stream s) { return stream_seed(seed, static_cast<uint64_t>(s)); }
inline uint64_t stream_seed(int64_t seed, TaskStream s) { return stream_seed(seed, static_cast<uint64_t>(s)); }

}  // namespace tapeformer
