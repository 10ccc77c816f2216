// "tmaze": the cue-recall T-maze (Bakker 2001; the memory test of
// Parisotto et al. 2020 and Chen et al. 2021's Key-to-Door analogue). The
// agent starts at the foot of a corridor of `corridor` cells; a cue, up or
// down (from the seed of reset()), is in the observation at the first step
// only. At the junction at the corridor's end, turning to the cue's side
// pays 1, the other side 0, and ends the episode.
//
//   actions:      0 forward, 1 up, 2 down (a turn in the corridor, or forward at the junction: no move)
//   reward:       1 for the turn the cue named, else 0
//   observation:  [position 0..corridor (corridor + 1), cue: 0 hidden, 1 up, 2 down (3)]
//   step cap:     corridor + 4 actions
//
// The expert walks forward and turns as the cue said; the behaviour policy
// "random" walks forward too and turns at random (half its episodes pay).
// A model that has forgotten the cue by the junction is at chance.
#include "tapeformer/core/error.h"
#include "tapeformer/data/rl/environment.h"

namespace tapeformer {
namespace {

class TMaze : public Environment {
 public:
  explicit TMaze(int64_t corridor) : corridor_(static_cast<int32_t>(corridor)) {}
  std::string name() const override { return "tmaze"; }
  std::vector<int32_t> feature_sizes() const override { return {corridor_ + 1, 3}; }
  int32_t actions() const override { return 3; }
  int64_t max_steps() const override { return corridor_ + 4; }

  Observation reset(uint64_t seed) override {
    Rng rng(seed);
    cue_ = 1 + static_cast<int32_t>(rng.below(2));
    position_ = 0;
    steps_ = 0;
    done_ = false;
    return {0, cue_};
  }

  StepResult step(int32_t action) override {
    TAPEFORMER_CHECK(!done_, "tmaze: the episode has ended (reset it)");
    TAPEFORMER_CHECK(action >= 0 && action < 3, "tmaze: action ", action, " is not one of 0..2");
    ++steps_;
    StepResult r;
    if (position_ < corridor_) {
      if (action == 0) ++position_;
    } else if (action != 0) {
      r.reward = action == cue_ ? 1 : 0;
      done_ = true;
    }
    done_ = done_ || steps_ >= max_steps();
    r.done = done_;
    r.observation = {position_, 0};
    return r;
  }

  int32_t expert_action() const override { return position_ < corridor_ ? 0 : cue_; }
  int32_t random_action(Rng& rng) const override {
    return position_ < corridor_ ? 0 : 1 + static_cast<int32_t>(rng.below(2));
  }
  int32_t best_return() const override { return 1; }
  std::pair<int32_t, int32_t> reward_range() const override { return {0, 1}; }

 private:
  int32_t corridor_;
  int32_t cue_ = 1, position_ = 0;
  int64_t steps_ = 0;
  bool done_ = false;
};

}  // namespace

EnvironmentKind tmaze_environment_kind() {
  EnvironmentKind kind;
  kind.name = "tmaze";
  kind.summary = "the cue-recall T-maze: a cue seen at the first step decides which turn pays 1 at the end of a "
                 "corridor of `corridor` cells";
  kind.options = {{"corridor", 10}};
  kind.make = [](const EnvironmentOptions& o) -> std::unique_ptr<Environment> {
    const int64_t n = o.at("corridor");
    TAPEFORMER_CHECK(n >= 1 && n <= 100000, "tmaze: corridor must be in [1, 100000], got ", n);
    return std::make_unique<TMaze>(n);
  };
  return kind;
}

}  // namespace tapeformer
