// StopSignals: while one is alive, SIGTERM, SIGINT and SIGHUP (a closed
// terminal) only record that they came; the training loop reads received()
// after each step, saves a checkpoint and stops, and every long phase inside
// it (the evaluations, the data read for them) calls stop_point() between
// pieces of work a second or less long. SIGINT and SIGHUP are left alone when
// the process ignores them (a background job, nohup). SIGXFSZ (a write past
// `ulimit -f`) is ignored, so the write fails with EFBIG and the writer
// reports it instead of the process dying with no message. The previous
// actions come back when the outermost one goes (they nest).
//
//   const StopSignals stop;
//   for (...) { step(); if (stop.received()) { save(); throw Interrupted(...); } }
//   for (window : text) { stop_point(nullptr, "evaluation"); ... }   // Interrupted when one came
//
// With no StopSignals alive a signal keeps its usual action (the process
// ends), and stop_point() never throws.
#pragma once

#include <signal.h>

#include <string>

#include "tapeformer/core/error.h"

namespace tapeformer {

class ProcessGroup;

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The last signal received since the outermost one was made (SIGINT, SIGTERM or SIGHUP), or 0.
  int received() const;
  // "SIGINT", "SIGTERM", "SIGHUP" (or "a signal").
  static const char* name(int signal);
};

// What a stopped phase throws: the message says what was stopped and what
// was kept; signal() gives the exit status 128 + signal.
class Interrupted : public Error {
 public:
  Interrupted(const std::string& message, int signal);
  int signal() const { return signal_; }

 private:
  int signal_;
};

// The signal a live StopSignals recorded (0: none came, or none is alive).
int stop_signal();
// Throws Interrupted ("interrupted (SIGINT) during PHASE") when a signal came.
// With a group (a distributed run) every rank must call it at the same
// point: the ranks agree (the largest signal any rank saw), so all stop
// together or none does.
void stop_point(ProcessGroup* group, const std::string& phase);

}  // namespace tapeformer
