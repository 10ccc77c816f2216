#include "tapeformer/train/signals.h"

#include <csignal>

#include "tapeformer/train/process_group.h"

namespace tapeformer {
namespace {

// The handler only records the signal: nothing else is async-signal-safe.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void record_stop_signal(int sig) { g_stop_signal = sig; }

// The outermost StopSignals' saved actions; the inner ones change nothing.
int g_depth = 0;
struct sigaction g_old_term {}, g_old_int {}, g_old_hup {}, g_old_xfsz {};
bool g_catch_int = false, g_catch_hup = false;

// Installs `sa` for `sig` unless the process ignores it; whether it did.
bool catch_unless_ignored(int sig, const struct sigaction& sa, struct sigaction* old) {
  sigaction(sig, nullptr, old);
  if (old->sa_handler == SIG_IGN) return false;
  sigaction(sig, &sa, nullptr);
  return true;
}

}  // namespace

StopSignals::StopSignals() {
  if (g_depth++ > 0) return;
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = record_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &g_old_term);
  g_catch_int = catch_unless_ignored(SIGINT, sa, &g_old_int);
  g_catch_hup = catch_unless_ignored(SIGHUP, sa, &g_old_hup);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGXFSZ, &ignore, &g_old_xfsz);
}

StopSignals::~StopSignals() {
  if (--g_depth > 0) return;
  sigaction(SIGTERM, &g_old_term, nullptr);
  if (g_catch_int) sigaction(SIGINT, &g_old_int, nullptr);
  if (g_catch_hup) sigaction(SIGHUP, &g_old_hup, nullptr);
  sigaction(SIGXFSZ, &g_old_xfsz, nullptr);
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

Interrupted::Interrupted(const std::string& message, int signal) : Error(message), signal_(signal) {}

int stop_signal() { return g_depth > 0 ? static_cast<int>(g_stop_signal) : 0; }

void stop_point(ProcessGroup* group, const std::string& phase) {
  const int signal = group ? static_cast<int>(group->max(stop_signal())) : stop_signal();
  if (signal == 0) return;
  throw Interrupted(std::string(signal == SIGINT ? "interrupted (" : "stopped (") + StopSignals::name(signal) +
                        ") during " + phase,
                    signal);
}

}  // namespace tapeformer
