// `tapeformer rl ...`: offline reinforcement learning on the environments of
// data/rl/environment.h.
//
//   RlCollectArgs a;  a.env = "keys_doors";  a.policy = "random:0.7,noisy:0.3";  a.episodes = 2000;
//   a.out = "grid.traj";
//   run_rl_collect(a);   // writes the dataset, prints one JSON line (returns by policy)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tapeformer {

struct RlCollectArgs {
  std::string env;                  // an environment kind
  std::vector<std::string> options;  // name=value, the environment's options (tmaze: corridor=30)
  std::string policy = "random";    // a policy mix, e.g. random:0.7,noisy:0.3
  double epsilon = 0.3;             // "noisy": the chance of a random action
  int64_t episodes = 1000;
  uint64_t seed = 1;
  std::string out;                  // the dataset file to write
};

// Prints {"episodes", "steps", "return_mean", "return_sd", "return_max",
// "best_return_mean", "by_policy": {name: {"episodes", "return_mean"}}, "checksum"}.
int run_rl_collect(const RlCollectArgs& args);

}  // namespace tapeformer
