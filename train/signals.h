// StopSignals: while one is alive, SIGTERM and SIGINT (unless a shell left
// SIGINT ignored: a background job, nohup) only record that they came; the
// training loop reads received() after each step, saves a checkpoint and
// stops. The previous actions come back when it goes.
//
//   const StopSignals stop;
//   for (...) { step(); if (stop.received()) { save(); throw Interrupted(...); } }
#pragma once

#include <signal.h>

namespace tapeformer {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The last signal received since construction (SIGINT or SIGTERM), or 0.
  int received() const;

 private:
  struct sigaction old_term_ {}, old_int_ {};
  bool catch_int_ = false;
};

}  // namespace tapeformer
