#include "tapeformer/train/profile_report.h"

#include <sys/resource.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "tapeformer/core/storage.h"

namespace tapeformer {
namespace {

int64_t peak_rss() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux: kilobytes
}

template <class... Args>
std::string row(const char* fmt, const std::string& name, Args... args) {
  char buf[160];
  std::snprintf(buf, sizeof buf, fmt, name.c_str(), args...);
  return buf;
}

}  // namespace

StepProfiler::StepProfiler() { profile::take(); }  // nothing from before

StepProfiler::~StepProfiler() { profile::set_enabled(false); }

void StepProfiler::begin_step() {
  requested_at_ = Storage::requested_bytes();
  system_at_ = Storage::system_bytes();
  profile::set_enabled(true);
}

void StepProfiler::end_step(double seconds) {
  profile::set_enabled(false);
  const int64_t system = Storage::system_bytes() - system_at_;
  if (!warmed_up_) {
    profile::take();
    profile::take_bytes_sent();
    warmup_new_ = system;
    warmed_up_ = true;
    return;
  }
  ++steps_;
  seconds_ += seconds;
  requested_ += Storage::requested_bytes() - requested_at_;
  new_ += system;
  sent_ += profile::take_bytes_sent();
}

StepProfile StepProfiler::finish(int threads, int shards) {
  StepProfile p;
  p.steps = steps_;
  p.step_seconds = seconds_;
  p.threads = threads;
  p.shards = shards;
  p.entries = profile::take();
  const double steps = static_cast<double>(std::max<int64_t>(1, steps_));
  p.requested_bytes_per_step = static_cast<double>(requested_) / steps;
  p.new_bytes = new_;
  p.warmup_new_bytes = warmup_new_;
  p.peak_rss_bytes = peak_rss();
  p.bytes_sent_per_step = static_cast<double>(sent_) / steps;
  return p;
}

std::string StepProfile::table() const {
  if (steps == 0 || step_seconds <= 0)  // only the warm-up step ran: there is nothing to divide by
    return "profile: no step after the warm-up step was timed (profiling needs at least 2 steps)\n";
  const double n = static_cast<double>(std::max<int64_t>(1, steps));
  const double step_ms = step_seconds / n * 1e3;
  std::string out;
  char head[200];
  std::snprintf(head, sizeof head, "profile: %lld steps after a warm-up step, %.1f ms per step, %d threads, %d shards\n",
                static_cast<long long>(steps), step_ms, threads, shards);
  out += head;
  out += "  step phase (wall clock)         ms/step   share\n";
  double phases_ms = 0, fb_ms = 0;
  for (const profile::Entry& e : entries) {
    if (e.kind != profile::Kind::Phase) continue;
    const double ms = e.forward_s / n * 1e3;
    phases_ms += ms;
    if (e.name == "forward + backward") fb_ms = ms;
    out += row("  %-30s %8.1f  %5.1f%%\n", e.name, ms, 100 * ms / step_ms);
  }
  out += row("  %-30s %8.1f  %5.1f%%\n", "other", step_ms - phases_ms, 100 * (step_ms - phases_ms) / step_ms);

  // Kernel families: thread-seconds over the shard threads that ran forward + backward.
  const double available_ms = fb_ms * std::min(threads, shards);
  out += "  forward + backward by kernel    forward ms  backward ms  share (thread time)\n";
  double families_ms = 0;
  for (const profile::Entry& e : entries) {
    if (e.kind != profile::Kind::Family) continue;
    const double f = e.forward_s / n * 1e3, b = e.backward_s / n * 1e3;
    families_ms += f + b;
    out += row("  %-30s %10.1f  %11.1f  %5.1f%%\n", e.name, f, b, available_ms > 0 ? 100 * (f + b) / available_ms : 0);
  }
  const double rest = available_ms - families_ms;
  out += row("  %-30s %10s  %11s  %5.1f%%\n", "tape, allocation, waiting", "", "",
             available_ms > 0 ? 100 * rest / available_ms : 0);
  char mem[300];
  std::snprintf(mem, sizeof mem,
                "  memory: %.1f MB of tensors per step (from the reuse cache), %.1f MB new from the system in the "
                "warm-up step, %.3f MB new in the %lld steps after it; peak RSS %.1f MB\n",
                requested_bytes_per_step / 1e6, static_cast<double>(warmup_new_bytes) / 1e6,
                static_cast<double>(new_bytes) / 1e6, static_cast<long long>(steps),
                static_cast<double>(peak_rss_bytes) / 1e6);
  out += mem;
  if (bytes_sent_per_step > 0) {
    char net[160];
    std::snprintf(net, sizeof net, "  network: %.3f MB sent per step by this rank to the others\n",
                  bytes_sent_per_step / 1e6);
    out += net;
  }
  return out;
}

std::string StepProfile::json() const {
  using nlohmann::json;
  const double n = static_cast<double>(std::max<int64_t>(1, steps));
  json phases = json::array(), families = json::array();
  for (const profile::Entry& e : entries) {
    if (e.kind == profile::Kind::Phase) {
      phases.push_back({{"name", e.name}, {"ms_per_step", e.forward_s / n * 1e3}, {"calls", e.calls}});
    } else {
      families.push_back({{"name", e.name},
                          {"forward_ms_per_step", e.forward_s / n * 1e3},
                          {"backward_ms_per_step", e.backward_s / n * 1e3},
                          {"calls", e.calls}});
    }
  }
  const json j = {{"steps", steps},
                  {"ms_per_step", step_seconds / n * 1e3},
                  {"threads", threads},
                  {"shards", shards},
                  {"phases", phases},
                  {"families_thread_ms", families},
                  {"tensor_bytes_per_step", requested_bytes_per_step},
                  {"new_bytes_warmup_step", warmup_new_bytes},
                  {"new_bytes_after_warmup", new_bytes},
                  {"peak_rss_bytes", peak_rss_bytes},
                  {"bytes_sent_per_step", bytes_sent_per_step}};
  return j.dump(1) + "\n";
}

}  // namespace tapeformer
