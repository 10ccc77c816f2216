#include "tapeformer/train/signals.h"

#include <csignal>

namespace tapeformer {
namespace {

// The handler only records the signal: nothing else is async-signal-safe.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void record_stop_signal(int sig) { g_stop_signal = sig; }

}  // namespace

StopSignals::StopSignals() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = record_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &old_term_);
  sigaction(SIGINT, nullptr, &old_int_);
  catch_int_ = old_int_.sa_handler != SIG_IGN;
  if (catch_int_) sigaction(SIGINT, &sa, nullptr);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &old_term_, nullptr);
  if (catch_int_) sigaction(SIGINT, &old_int_, nullptr);
}

int StopSignals::received() const { return g_stop_signal; }

}  // namespace tapeformer
