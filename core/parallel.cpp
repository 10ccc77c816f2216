#include "tapeformer/core/parallel.h"

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_invoke.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "tapeformer/core/error.h"
#include "tapeformer/core/numbers.h"
#include "tapeformer/core/profile.h"

namespace tapeformer::parallel {
namespace {

int hardware_threads() { return std::max(1, tbb::info::default_concurrency()); }

int env_threads() {
  const char* s = std::getenv("TAPEFORMER_THREADS");
  if (!s || !*s) return 0;
  const int64_t v = number_error<int64_t>(s).empty() ? parse_number<int64_t>(s, "") : -1;
  TAPEFORMER_CHECK(v >= 0 && v <= 1024,
                   "TAPEFORMER_THREADS: expected a thread count 0..1024, got '", s, "'");
  return static_cast<int>(v);
}

struct State {
  std::mutex mu;
  int threads = 0;
  std::unique_ptr<tbb::global_control> control;
};

State& state() {
  static State s;
  return s;
}

// n == 0: the default, $TAPEFORMER_THREADS when set, else the hardware threads.
void apply(State& s, int n) {
  if (n == 0) n = env_threads();
  s.threads = n == 0 ? hardware_threads() : n;
  s.control = std::make_unique<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, static_cast<size_t>(s.threads));
}

// Depth of parallel regions on this thread: nested regions run serially.
thread_local int t_depth = 0;

struct Region {
  Region() { ++t_depth; }
  ~Region() { --t_depth; }
};

}  // namespace

bool in_parallel_region() { return t_depth > 0; }

void set_num_threads(int n) {
  TAPEFORMER_CHECK(n >= 0, "set_num_threads: thread count must be >= 0, got ", n);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  apply(s, n);
}

int num_threads() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.threads == 0) apply(s, 0);
  return s.threads;
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int threads = num_threads();
  // A few chunks per thread balance uneven rows without making boundaries
  // depend on scheduling.
  const int64_t max_chunks = threads == 1 ? 1 : int64_t{4} * threads;
  const int64_t chunks = std::min<int64_t>(max_chunks, (n + grain - 1) / grain);
  if (chunks <= 1 || t_depth > 0) {
    fn(0, n);
    return;
  }
  const int64_t step = (n + chunks - 1) / chunks;
  const bool owned = profile::enabled() && profile::in_family_scope();  // the scope times the chunks
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, chunks, 1),
      [&](const tbb::blocked_range<int64_t>& r) {
        Region region;
        profile::ChunkOfScope chunk(owned);
        for (int64_t c = r.begin(); c != r.end(); ++c) {
          const int64_t b = c * step, e = std::min(n, b + step);
          if (b < e) fn(b, e);
        }
      },
      tbb::simple_partitioner());
}

void for_each_block(const std::vector<int64_t>& sizes, int64_t block,
                    const std::function<void(size_t, int64_t, int64_t)>& fn) {
  TAPEFORMER_CHECK(block >= 1, "for_each_block: block must be >= 1, got ", block);
  struct Item {
    size_t buffer;
    int64_t begin, end;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < sizes.size(); ++i)
    for (int64_t b = 0; b < sizes[i]; b += block) items.push_back({i, b, std::min(sizes[i], b + block)});
  parallel_for(static_cast<int64_t>(items.size()), 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) fn(items[k].buffer, items[k].begin, items[k].end);
  });
}

void invoke(const std::function<void()>& a, const std::function<void()>& b) {
  if (t_depth > 0 || num_threads() == 1) {
    a();
    b();
    return;
  }
  const bool owned = profile::enabled() && profile::in_family_scope();
  tbb::parallel_invoke(
      [&] {
        Region region;
        profile::ChunkOfScope chunk(owned);
        a();
      },
      [&] {
        Region region;
        profile::ChunkOfScope chunk(owned);
        b();
      });
}

}  // namespace tapeformer::parallel
