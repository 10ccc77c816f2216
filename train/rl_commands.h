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

// `rl train`: a Decision Transformer (model.arch decision_transformer, or
// behaviour cloning with model.dt_returns = false) trained by the stock
// Trainer on windows of model.block_size steps of a dataset's episodes
// (data/rl/episode_windows.h); the last tenth of the episodes (at least one)
// is held out, and evaluations report its loss and action accuracy. The
// model's state features, timestep table and the dataset's checksum
// (model.dt_dataset) come from the dataset; a resumed run refuses a dataset
// whose checksum changed.
struct RlTrainArgs {
  std::string config;                  // training config; optional with resume
  std::string data;                    // the dataset (rl collect); with resume, default: the run's
  std::string out;
  std::vector<std::string> overrides;  // key=value
  bool resume = false;
};
int run_rl_train(const RlTrainArgs& args);

// `rl eval`: the run's model acting in its dataset's environment, conditioned
// on `target_return` (R_1; after each reward r, R <- R - r), greedy, over
// `episodes` layouts none of which is in the dataset. Prints
// {"target_return", "episodes", "return_mean", "return_sd", "best_return_mean", ...}.
struct RlEvalArgs {
  std::string checkpoint;  // a run directory of rl train
  int64_t target_return = 0;  // within the environment's return_bounds
  int64_t episodes = 20;
  uint64_t seed = 1;
  std::string log;  // also append the result line here ("": no)
};
int run_rl_eval(const RlEvalArgs& args);

}  // namespace tapeformer
