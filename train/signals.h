// StopSignals: while one is alive, SIGTERM, SIGINT and SIGHUP (a closed
// terminal) only record that they came; the training loop reads received()
// after each step, saves a checkpoint and stops. SIGINT and SIGHUP are left
// alone when the process ignores them (a background job, nohup). SIGXFSZ
// (a write past `ulimit -f`) is ignored, so the write fails with EFBIG and
// the writer reports it instead of the process dying with no message. The
// previous actions come back when it goes.
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
  // The last signal received since construction (SIGINT, SIGTERM or SIGHUP), or 0.
  int received() const;
  // "SIGINT", "SIGTERM", "SIGHUP" (or "signal N").
  static const char* name(int signal);

 private:
  struct sigaction old_term_ {}, old_int_ {}, old_hup_ {}, old_xfsz_ {};
  bool catch_int_ = false, catch_hup_ = false;
};

}  // namespace tapeformer
