// The checks every rank of an mpirun job makes before the first step, so
// that ranks started differently are refused at once, by every rank, instead
// of training apart until a collective never meets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/data/token_file.h"
#include "tapeformer/train/process_group.h"

namespace tapeformer {

// The same run on every rank: the same config (with the data's
// vocabulary) and tokenizer, in `run` (text), and the same shard count; a
// rank that differs (another config file, another data file at the same
// path) is named.
void check_same_run(ProcessGroup& group, const std::string& run, int64_t shards);

// The same state on every rank: the same step, the same checkpoint (its
// payload's checksum; 0 for a fresh run) and the same data (a hash of the
// token ids of `splits`, null entries skipped, so another text behind the
// same path `data_path` is caught).
void check_same_state(ProcessGroup& group, int64_t start_step, uint64_t checkpoint_hash,
                      const std::vector<const TokenSource*>& splits, const std::string& data_path);

}  // namespace tapeformer
