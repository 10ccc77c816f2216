// Environments for offline reinforcement learning (the Decision Transformer's
// data): small deterministic worlds written in C++, no download, as one
// interface with kinds selected by name.
//
//   std::unique_ptr<Environment> env = environment_kinds().get("keys_doors").make({});
//   Observation o = env->reset(/*seed=*/7);        // the episode's layout comes from the seed
//   while (true) {
//     StepResult r = env->step(env->expert_action());
//     if (r.done) break;
//   }
//
// An observation is a few categorical features (the agent's cell, whether
// it holds the key, ...): feature i takes values 0..feature_sizes()[i]-1, so
// a model embeds each with a table of its own. Actions are 0..actions()-1.
// Rewards are integers. Given the seed of reset() and the actions, every
// episode is the same on every machine.
//
// Kinds: "keys_doors" (a 6 x 6 grid world of two rooms joined by a locked
// door: fetch the key, open the door, reach the goal; data/rl/keys_doors.cpp),
// "tmaze" (the cue-recall T-maze: a cue seen at the first step decides which
// arm of the junction at the end of a corridor pays; data/rl/tmaze.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/core/registry.h"
#include "tapeformer/core/rng.h"

namespace tapeformer {

using Observation = std::vector<int32_t>;  // one value per feature

struct StepResult {
  Observation observation;  // after the action
  int32_t reward = 0;
  bool done = false;        // the episode ended (goal, final choice or the step cap)
};

class Environment {
 public:
  virtual ~Environment() = default;
  virtual std::string name() const = 0;
  virtual std::vector<int32_t> feature_sizes() const = 0;  // categories of each observation feature
  virtual int32_t actions() const = 0;
  virtual int64_t max_steps() const = 0;                   // the step cap: an episode has at most this many actions
  // The first observation of the episode the seed lays out.
  virtual Observation reset(uint64_t seed) = 0;
  // Error when the episode has ended or the action is out of range.
  virtual StepResult step(int32_t action) = 0;
  // A best action from the current state (the scripted expert; ties broken the same way every time).
  virtual int32_t expert_action() const = 0;
  // The behaviour policy "random": a uniform action unless the kind says otherwise.
  virtual int32_t random_action(Rng& rng) const { return static_cast<int32_t>(rng.below(static_cast<uint64_t>(actions()))); }
  // The best return an episode of this layout can reach (what the expert gets).
  virtual int32_t best_return() const = 0;
  // The least and the most reward one step can give. A dataset holding a
  // reward outside is refused as forged, and so are returns outside
  // return_bounds().
  virtual std::pair<int32_t, int32_t> reward_range() const = 0;
};

// The least and the most an episode can return: up to max_steps() rewards,
// each in reward_range() (0 included, for an episode that ends at once).
// Returns to go (a target less the return so far) are int32 model inputs:
// Error naming the environment when the span of these bounds exceeds one.
std::pair<int64_t, int64_t> return_bounds(const Environment& env);

// Options by name (the corridor's length), each kind's defaults filled in by make.
using EnvironmentOptions = std::map<std::string, int64_t>;

struct EnvironmentKind {
  std::string name;
  std::string summary;                 // one line, for errors and docs
  EnvironmentOptions options;          // the options it reads, with their defaults
  std::function<std::unique_ptr<Environment>(const EnvironmentOptions&)> make;  // Error naming a bad option
};

// The table of environments (data/rl/environment.cpp). A program may add its own.
Registry<EnvironmentKind>& environment_kinds();
// `kind`'s defaults with `given` over them; Error naming an option the kind does not have.
EnvironmentOptions environment_options(const EnvironmentKind& kind, const EnvironmentOptions& given);

}  // namespace tapeformer
