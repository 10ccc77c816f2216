#include "tapeformer/core/profile.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace tapeformer::profile {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Sums {
  Kind kind = Kind::Family;
  int64_t forward_ns = 0, backward_ns = 0, calls = 0;
};

// One thread's sums, owned by the registry so that they outlive the thread.
struct ThreadSums {
  std::mutex mu;  // the owner adds, take() reads and zeroes
  std::unordered_map<const char*, Sums> by_name;
};

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<ThreadSums>> threads;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: worker threads may outlive statics
  return *r;
}

ThreadSums& this_thread() {
  thread_local ThreadSums* mine = [] {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.threads.push_back(std::make_unique<ThreadSums>());
    return r.threads.back().get();
  }();
  return *mine;
}

thread_local Scope* t_family = nullptr;  // the innermost open family scope
thread_local bool t_backward = false;
thread_local int t_owned_chunks = 0;      // > 0: a chunk of another thread's family scope

}  // namespace

void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

void Scope::start(const char* name, Kind kind) {
  if (t_owned_chunks > 0) return;  // the scope that ran this chunk's loop has its time
  name_ = name;
  kind_ = kind;
  if (kind == Kind::Family) {
    parent_ = t_family;
    t_family = this;
  }
  start_ns_ = now_ns();
}

void Scope::stop() {
  const int64_t elapsed = now_ns() - start_ns_;
  int64_t self = elapsed;
  if (kind_ == Kind::Family) {
    self -= children_ns_;
    if (parent_) parent_->children_ns_ += elapsed;
    t_family = parent_;
  }
  ThreadSums& t = this_thread();
  std::lock_guard<std::mutex> lock(t.mu);
  Sums& s = t.by_name[name_];
  s.kind = kind_;
  (kind_ == Kind::Family && t_backward ? s.backward_ns : s.forward_ns) += self;
  ++s.calls;
}

BackwardPass::BackwardPass() : previous_(t_backward) { t_backward = true; }
BackwardPass::~BackwardPass() { t_backward = previous_; }

bool in_family_scope() { return t_family != nullptr || t_owned_chunks > 0; }

ChunkOfScope::ChunkOfScope(bool owned) : owned_(owned) {
  if (owned_) ++t_owned_chunks;
}
ChunkOfScope::~ChunkOfScope() {
  if (owned_) --t_owned_chunks;
}

std::vector<Entry> take() {
  std::map<std::string, Entry> merged;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& t : r.threads) {
    std::lock_guard<std::mutex> tl(t->mu);
    for (auto& [name, s] : t->by_name) {
      Entry& e = merged[name];
      e.name = name;
      e.kind = s.kind;
      e.forward_s += static_cast<double>(s.forward_ns) * 1e-9;
      e.backward_s += static_cast<double>(s.backward_ns) * 1e-9;
      e.calls += s.calls;
    }
    t->by_name.clear();
  }
  std::vector<Entry> out;
  for (auto& [name, e] : merged) out.push_back(std::move(e));
  std::stable_sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.forward_s + a.backward_s > b.forward_s + b.backward_s;
  });
  return out;
}

}  // namespace tapeformer::profile
