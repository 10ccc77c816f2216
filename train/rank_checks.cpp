#include "tapeformer/train/rank_checks.h"

#include <algorithm>
#include <functional>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"

namespace tapeformer {

void check_same_run(ProcessGroup& group, const std::string& run, int64_t shards) {
  const uint64_t mine = std::hash<std::string>()(run) ^ static_cast<uint64_t>(shards);
  const std::vector<uint64_t> all = allgather_equal(group, std::vector<uint64_t>{mine});
  for (size_t r = 1; r < all.size(); ++r)
    TAPEFORMER_CHECK(all[r] == all[0], "rank ", r, " of ", all.size(), " was started with another config, data "
                     "file or shard count than rank 0 (every process of an mpirun job must run the same command "
                     "and read the same data)");
}

void check_same_state(ProcessGroup& group, int64_t start_step, uint64_t checkpoint_hash,
                      const std::vector<const TokenSource*>& splits, const std::string& data_path) {
  uint64_t data_hash = kFnvOffset;
  std::vector<int32_t> ids;
  for (const TokenSource* split : splits) {
    if (split == nullptr) continue;
    for (int64_t i = 0; i < split->size(); i += int64_t{1} << 20) {
      ids.resize(static_cast<size_t>(std::min<int64_t>(int64_t{1} << 20, split->size() - i)));
      split->read(i, static_cast<int64_t>(ids.size()), ids.data());
      data_hash = fnv1a64(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t), data_hash);
    }
  }
  const std::vector<uint64_t> mine{static_cast<uint64_t>(start_step), checkpoint_hash, data_hash};
  const std::vector<uint64_t> all = allgather_equal(group, mine);
  const auto of = [&](size_t r, size_t field) { return all[r * mine.size() + field]; };
  for (size_t r = 1; r < all.size() / mine.size(); ++r) {
    TAPEFORMER_CHECK(of(r, 2) == of(0, 2), "rank ", r, " of ", group.size(), " reads other data than rank 0 ",
                     "(the token ids of '", data_path, "' differ: another file behind the same path?); every "
                     "process of an mpirun job must read the same data");
    const auto start = [&](size_t q) {
      return of(q, 0) == 0 && of(q, 1) == 0 ? std::string("starts a fresh run") : "resumes step " + std::to_string(of(q, 0));
    };
    TAPEFORMER_CHECK(of(r, 0) == of(0, 0), "rank ", r, " of ", group.size(), " ", start(r), " but rank 0 ", start(0),
                     "; every process of an mpirun job must resume the same checkpoint (the same --out, or copies "
                     "of one file)");
    TAPEFORMER_CHECK(of(r, 1) == of(0, 1), "rank ", r, " of ", group.size(), " resumes another checkpoint of step ",
                     of(0, 0), " than rank 0 (the files differ); every process of an mpirun job must resume the "
                     "same checkpoint (the same --out, or copies of one file)");
  }
}

}  // namespace tapeformer
