// Offline RL datasets: episodes of an environment (data/rl/environment.h)
// played by scripted behaviour policies, and the file that holds them.
//
//   PolicyMix mix = parse_policy_mix("random:0.7,noisy:0.3");
//   Trajectories data = collect("keys_doors", {}, mix, /*episodes=*/1000, /*seed=*/1);
//   save_trajectories("grid.traj", data);                // a checked file, written atomically
//   Trajectories back = load_trajectories("grid.traj");  // Error naming the file when damaged
//
// Behaviour policies: "expert" (the environment's scripted best action),
// "random" (the environment's random action: uniform, or the T-maze's walk
// with a random turn), "noisy" (the expert, a random action with
// probability epsilon). A mix gives each episode one policy, drawn with the
// mix's weights from the episode's own stream, so a dataset depends only on
// its arguments. The file: magic "TFRLTRJ1", version, payload length, the
// payload's FNV-1a 64 (core/files.h), then the environment's name, options,
// feature sizes, actions and step cap, and every episode.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/data/rl/environment.h"

namespace tapeformer {

struct Episode {
  std::vector<Observation> observations;  // before each action
  std::vector<int32_t> actions;
  std::vector<int32_t> rewards;           // after each action
  std::string policy;                     // the behaviour policy that acted
  uint64_t seed = 0;                      // the seed of the environment's reset()
  int64_t total() const;                  // the return: the sum of the rewards
};

struct Trajectories {
  std::string env;                     // the environment kind
  EnvironmentOptions options;          // its options, defaults filled in
  std::vector<int32_t> feature_sizes;  // as the environment's
  int32_t actions = 0;
  int64_t max_steps = 0;
  std::vector<Episode> episodes;
  uint64_t checksum = 0;  // of the file's payload (load_trajectories sets it): what a run records
};

struct PolicyMix {
  std::vector<std::pair<std::string, double>> weights;  // policy name, weight > 0
  double epsilon = 0.3;                                  // "noisy": the chance of a random action
};
// "random:0.7,noisy:0.3" (weights need not sum to 1); Error naming a bad entry.
PolicyMix parse_policy_mix(const std::string& text, double epsilon = 0.3);

// `episodes` episodes of `env` with `options`, each by a policy of the mix.
Trajectories collect(const std::string& env, const EnvironmentOptions& options, const PolicyMix& mix, int64_t episodes,
                     uint64_t seed);

// Returns the payload's checksum (what load_trajectories reports as `checksum`).
uint64_t save_trajectories(const std::string& path, const Trajectories& data);
// Error naming the file: missing, not a dataset, truncated, corrupted, or
// holding values outside the environment's ranges.
Trajectories load_trajectories(const std::string& path);

}  // namespace tapeformer
