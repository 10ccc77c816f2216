// Checkpoints: everything needed to resume a run identically, or to sample.
//
//   save_checkpoint(out_dir + "/checkpoint.bin", ckpt);   // atomic
//   Checkpoint c = load_checkpoint(path);                  // validated
//
// File layout: magic "TFCKPT01", format version (u32), payload length (u64),
// FNV-1a 64 checksum of the payload (u64), then the payload as a cereal
// binary archive. A truncated or corrupted file is rejected by the length and
// checksum checks with an Error naming the path before anything is parsed.
// Writes go to a temporary file in the same directory, are fsync'ed, renamed
// over the target and the directory is fsync'ed: a crash leaves either the old
// checkpoint or the new one, never half of one.
#pragma once

#include <cmath>
#include <string>

#include "tapeformer/core/files.h"  // check_regular_file, write_file_atomic, remove_stale_temp_files
#include "tapeformer/core/rng.h"
#include "tapeformer/layers/module.h"

namespace tapeformer {

// 2 added train_loss and, in a memory run's sampler state, the compressed memory;
// 3 added eval_pending. Version 1 and 2 files still load (train_loss NaN:
// unknown; no evaluation pending).
inline constexpr uint32_t kCheckpointVersion = 3;

struct Checkpoint {
  std::string config_json;     // TrainConfig::to_json() of the run
  std::string tokenizer;       // the tokenizer, serialised (data/tokenizer.h)
  NamedTensors model;          // Module::state()
  NamedTensors optimizer;      // Optimizer::state_tensors()
  int64_t optimizer_step = 0;  // Optimizer::step_count()
  int64_t step = 0;            // completed training steps
  double train_seconds = 0;    // training-loop wall time so far (eval excluded)
  Rng rng;                     // dropout generator
  std::string sampler;         // the train batch sampler's state, serialised
  double train_loss = NAN;     // mean loss of the step `step` (NaN: a version 1 file, or no step yet)
  // A signal stopped the evaluation of step `step`: the resumed run evaluates
  // it before training on, and completes that step's metrics line.
  bool eval_pending = false;
  uint32_t version = kCheckpointVersion;  // the file's format (load_checkpoint sets it)
  uint64_t checksum = 0;                  // FNV-1a 64 of the file's payload (load_checkpoint sets it)
};

void save_checkpoint(const std::string& path, const Checkpoint& ckpt);
// Refuses a FIFO, device or socket before opening it (core/files.h).
Checkpoint load_checkpoint(const std::string& path);

// The file save_checkpoint writes for a payload: header (magic, version,
// length, checksum) + payload. For tests and tools that build files by hand.
std::string checkpoint_file_bytes(const std::string& payload);

}  // namespace tapeformer
