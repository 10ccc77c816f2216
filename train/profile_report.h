// The report of `tapeformer train --profile`: where the steady-state
// training steps spent their time and memory.
//
//   StepProfiler p;
//   for (...) { p.begin_step(); ... one step ...; p.end_step(seconds); }   // the first is a warm-up
//   StepProfile r = p.finish(threads, shards);
//   std::cerr << r.table();   // and write_file_atomic(out + "/profile.json", r.json())
//
// Phases are wall-clock seconds of the step's parts (data, forward +
// backward, gradient reduction, waiting for ranks, all-reduce, gradient
// norm, optimizer); the rest of the step is "other". Families are the
// kernels inside forward + backward, in thread-seconds summed over the
// shards' threads; the forward + backward phase times the shard threads
// gives the thread-seconds they had, and what no kernel accounts for is
// "tape, allocation, untimed ops and waiting" (including threads idle at the
// end of the phase).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/core/profile.h"

namespace tapeformer {

struct StepProfile {
  int64_t steps = 0;         // steady-state steps measured (after the warm-up)
  double step_seconds = 0;   // their total wall time
  int threads = 1, shards = 1;
  std::vector<profile::Entry> entries;
  double requested_bytes_per_step = 0;  // Storage bytes created per step (served by the cache or not)
  int64_t new_bytes = 0;                // taken from the system allocator during the measured steps
  int64_t warmup_new_bytes = 0;         // ... during the warm-up step
  int64_t peak_rss_bytes = 0;           // of the process, at the end
  double bytes_sent_per_step = 0;       // to the other ranks of a distributed run (0: one process)

  std::string table() const;  // for people: one row per phase and family
  std::string json() const;   // one object
};

// The timers run between begin_step() and end_step() only, so evaluation
// and checkpoints between steps stay out of the sums. The first step is the
// warm-up (buffers and caches fill): its times are dropped, its allocations
// reported apart.
class StepProfiler {
 public:
  StepProfiler();
  ~StepProfiler();  // the timers off
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  void begin_step();
  void end_step(double seconds);  // the step took this long (wall clock)
  StepProfile finish(int threads, int shards);

 private:
  bool warmed_up_ = false;
  int64_t steps_ = 0;
  double seconds_ = 0;
  int64_t requested_at_ = 0, system_at_ = 0;  // at the current step's start
  int64_t requested_ = 0, new_ = 0, warmup_new_ = 0, sent_ = 0;
};

}  // namespace tapeformer
