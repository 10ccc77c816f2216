// "keys_doors": a 6 x 6 grid of two rooms, columns 0-2 and 4-5, split by a
// wall in column 3 with one locked door. The seed of reset() places the
// door (its row), the agent and the key in the left room and the goal in
// the right one. Stepping on the key picks it up; the door lets the agent
// through only with the key; the border and the wall stop it (it stays).
//
//   actions:      0 up, 1 down, 2 left, 3 right
//   reward:       10 on the step that reaches the goal (the episode ends), else -1
//   observation:  [agent cell r * 6 + c (36), key cell or 36 once held (37), goal cell (36), door row (6)]
//   step cap:     30 actions
//
// The expert follows a shortest path over (cell, key held) states; its
// return is 11 - (the path's length).
#include <array>
#include <deque>

#include "tapeformer/core/error.h"
#include "tapeformer/data/rl/environment.h"

namespace tapeformer {
namespace {

constexpr int32_t kSide = 6, kCells = kSide * kSide, kWall = 3, kCap = 30;
constexpr std::array<int32_t, 4> kDr = {-1, 1, 0, 0}, kDc = {0, 0, -1, 1};

class KeysDoors : public Environment {
 public:
  std::string name() const override { return "keys_doors"; }
  std::vector<int32_t> feature_sizes() const override { return {kCells, kCells + 1, kCells, kSide}; }
  int32_t actions() const override { return 4; }
  int64_t max_steps() const override { return kCap; }

  Observation reset(uint64_t seed) override {
    Rng rng(seed);
    door_ = static_cast<int32_t>(rng.below(kSide));
    const auto left_cell = [&] {
      return static_cast<int32_t>(rng.below(kSide)) * kSide + static_cast<int32_t>(rng.below(kWall));
    };
    agent_ = left_cell();
    do key_ = left_cell();
    while (key_ == agent_);
    goal_ = static_cast<int32_t>(rng.below(kSide)) * kSide + kWall + 1 + static_cast<int32_t>(rng.below(2));
    held_ = false;
    steps_ = 0;
    done_ = false;
    return observe();
  }

  StepResult step(int32_t action) override {
    TAPEFORMER_CHECK(!done_, "keys_doors: the episode has ended (reset it)");
    TAPEFORMER_CHECK(action >= 0 && action < 4, "keys_doors: action ", action, " is not one of 0..3");
    agent_ = move(agent_, held_, action);
    if (agent_ == key_) held_ = true;
    ++steps_;
    StepResult r;
    const bool at_goal = agent_ == goal_;
    r.reward = at_goal ? 10 : -1;
    done_ = at_goal || steps_ >= kCap;
    r.done = done_;
    r.observation = observe();
    return r;
  }

  int32_t expert_action() const override {
    // Breadth-first search from the goal backwards would need reversed moves;
    // forwards from here, keeping each state's first action, is as short.
    std::array<int32_t, 2 * kCells> first;
    first.fill(-1);
    std::deque<int32_t> queue;
    const int32_t start = state(agent_, held_);
    first[static_cast<size_t>(start)] = 4;  // visited (the start: no action)
    queue.push_back(start);
    while (!queue.empty()) {
      const int32_t s = queue.front();
      queue.pop_front();
      const int32_t cell = s % kCells;
      const bool held = s >= kCells;
      if (cell == goal_) return first[static_cast<size_t>(s)];
      for (int32_t a = 0; a < 4; ++a) {
        const int32_t next_cell = move(cell, held, a);
        const int32_t next = state(next_cell, held || next_cell == key_);
        if (first[static_cast<size_t>(next)] != -1) continue;
        first[static_cast<size_t>(next)] = s == start ? a : first[static_cast<size_t>(s)];
        queue.push_back(next);
      }
    }
    return 0;  // unreachable goal: cannot happen on this map
  }

  std::pair<int32_t, int32_t> reward_range() const override { return {-1, 10}; }
  int32_t best_return() const override {
    KeysDoors copy = *this;
    copy.steps_ = 0;
    copy.done_ = false;
    int32_t total = 0;
    while (!copy.done_) total += copy.step(copy.expert_action()).reward;
    return total;
  }

 private:
  static int32_t state(int32_t cell, bool held) { return cell + (held ? kCells : 0); }
  // Where `action` takes the agent from `cell`.
  int32_t move(int32_t cell, bool held, int32_t action) const {
    const int32_t r = cell / kSide + kDr[static_cast<size_t>(action)], c = cell % kSide + kDc[static_cast<size_t>(action)];
    if (r < 0 || r >= kSide || c < 0 || c >= kSide) return cell;
    if (c == kWall && !(r == door_ && held)) return cell;
    return r * kSide + c;
  }
  Observation observe() const { return {agent_, held_ ? kCells : key_, goal_, door_}; }

  int32_t door_ = 0, agent_ = 0, key_ = 0, goal_ = 0;
  bool held_ = false, done_ = false;
  int64_t steps_ = 0;
};

}  // namespace

EnvironmentKind keys_doors_environment_kind() {
  EnvironmentKind kind;
  kind.name = "keys_doors";
  kind.summary = "a 6 x 6 grid of two rooms joined by a locked door: fetch the key, open the door, reach the goal "
                 "(-1 per step, 10 at the goal, 30 steps at most)";
  kind.make = [](const EnvironmentOptions&) -> std::unique_ptr<Environment> { return std::make_unique<KeysDoors>(); };
  return kind;
}

}  // namespace tapeformer
