#include "tapeformer/train/signals.h"

#include <csignal>

namespace tapeformer {
namespace {

// The handler only records the signal: nothing else is async-signal-safe.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void record_stop_signal(int sig) { g_stop_signal = sig; }

// Installs `sa` for `sig` unless the process ignores it; whether it did.
bool catch_unless_ignored(int sig, const struct sigaction& sa, struct sigaction* old) {
  sigaction(sig, nullptr, old);
  if (old->sa_handler == SIG_IGN) return false;
  sigaction(sig, &sa, nullptr);
  return true;
}

}  // namespace

StopSignals::StopSignals() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = record_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &old_term_);
  catch_int_ = catch_unless_ignored(SIGINT, sa, &old_int_);
  catch_hup_ = catch_unless_ignored(SIGHUP, sa, &old_hup_);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGXFSZ, &ignore, &old_xfsz_);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &old_term_, nullptr);
  if (catch_int_) sigaction(SIGINT, &old_int_, nullptr);
  if (catch_hup_) sigaction(SIGHUP, &old_hup_, nullptr);
  sigaction(SIGXFSZ, &old_xfsz_, nullptr);
}

int StopSignals::received() const { return g_stop_signal; }

const char* StopSignals::name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

}  // namespace tapeformer
