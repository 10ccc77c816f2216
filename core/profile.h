// Where a training step's time goes: `tapeformer train --profile`.
//
//   profile::set_enabled(true);
//   { profile::Scope s("matmul"); ... }       // this thread's time here goes to "matmul"
//   { profile::Scope s("optimizer", profile::Kind::Phase); ... }
//   std::vector<profile::Entry> e = profile::take();   // sums since the last take(), then zero
//
// Two kinds of timer:
// - Kind::Family (the kernels: matmul, attention, norm, ...): the time of
//   the thread that runs it, charged to the forward or the backward pass by
//   what the thread is doing (Tape::run_backward marks it with
//   BackwardPass). Nested family scopes are exclusive: attention's time does
//   not include a matmul it calls. Data-parallel shards each run on their
//   own thread, so families sum thread-seconds over the shards.
// - Kind::Phase (the trainer's step: shards, gradient reduction, optimizer,
//   ...): wall-clock time of the calling thread, however many threads the
//   phase keeps busy.
// When a family scope runs a parallel loop, the loop's chunks on other
// threads do not time themselves (their time is the scope's), so nothing is
// counted twice.
//
// Disabled (the default) a scope costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace tapeformer::profile {

enum class Kind { Family, Phase };

void set_enabled(bool on);
inline std::atomic<bool> g_enabled{false};
inline bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

class Scope {
 public:
  // `name` must outlive the process (a string literal): it is the key.
  explicit Scope(const char* name, Kind kind = Kind::Family) {
    if (enabled()) start(name, kind);
  }
  ~Scope() {
    if (name_) stop();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void start(const char* name, Kind kind);
  void stop();

  const char* name_ = nullptr;
  Kind kind_ = Kind::Family;
  Scope* parent_ = nullptr;
  int64_t start_ns_ = 0;
  int64_t children_ns_ = 0;
};

// Marks the current thread as running a backward pass for its lifetime.
class BackwardPass {
 public:
  BackwardPass();
  ~BackwardPass();
  BackwardPass(const BackwardPass&) = delete;
  BackwardPass& operator=(const BackwardPass&) = delete;

 private:
  bool previous_;
};

// For parallel.cpp: whether a family scope is open on this thread (its
// parallel loops then own their chunks' time), and the guard a chunk runs
// under when it is.
bool in_family_scope();
class ChunkOfScope {
 public:
  explicit ChunkOfScope(bool owned);
  ~ChunkOfScope();
  ChunkOfScope(const ChunkOfScope&) = delete;
  ChunkOfScope& operator=(const ChunkOfScope&) = delete;

 private:
  bool owned_;
};

// Bytes this process sent to the other processes of a distributed run (the
// ProcessGroup's collectives add them), counted while profiling is enabled.
inline std::atomic<int64_t> g_bytes_sent{0};
inline void add_bytes_sent(int64_t bytes) {
  if (enabled()) g_bytes_sent.fetch_add(bytes, std::memory_order_relaxed);
}
// The count since the last call, then zero.
inline int64_t take_bytes_sent() { return g_bytes_sent.exchange(0); }

struct Entry {
  std::string name;
  Kind kind = Kind::Family;
  double forward_s = 0;   // families: outside a backward pass; phases: all of it
  double backward_s = 0;  // families only
  int64_t calls = 0;
};

// Every timer's sums over all threads since the last take(), largest first;
// the counters start again from zero.
std::vector<Entry> take();

}  // namespace tapeformer::profile
