// `tapeformer rl collect | train | eval`: offline reinforcement learning on
// the environments of data/rl/environment.h, with the Decision Transformer
// (layers/models/decision_transformer.h).
//
//   tapeformer rl collect --env keys_doors --policy random:0.7,noisy:0.3 --episodes 2000 --out grid.traj
//   tapeformer rl train --config configs/dt_grid.json --data grid.traj --out out/dt
//   tapeformer rl eval --checkpoint out/dt --target-return 0 --episodes 20
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "tapeformer/core/program_name.h"
#include "tapeformer/commands/command.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/numbers.h"
#include "tapeformer/core/files.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/data/rl/episode_windows.h"
#include "tapeformer/data/rl/trajectories.h"
#include "tapeformer/layers/models/decision_transformer.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/train/streams.h"
#include "tapeformer/train/trainer.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/run_directory.h"

namespace tapeformer {
namespace {
namespace fs = std::filesystem;

// `rl collect`: episodes of an environment played by scripted behaviour
// policies, written as a dataset (data/rl/trajectories.h).
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

// Mean and sample standard deviation (0 for one value) of returns.
std::pair<double, double> mean_sd(const std::vector<double>& v) {
  double sum = 0, sd = 0;
  for (double x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  for (double x : v) sd += (x - mean) * (x - mean);
  return {mean, v.size() > 1 ? std::sqrt(sd / static_cast<double>(v.size() - 1)) : 0.0};
}

int run_rl_collect(const RlCollectArgs& args) {
  TAPEFORMER_CHECK(!args.out.empty(), "rl collect: name the dataset to write with --out FILE");
  RunDirectory::check_output("rl collect", args.out, {});
  EnvironmentOptions options;
  for (const std::string& o : args.options) {
    const size_t eq = o.find('=');
    TAPEFORMER_CHECK(eq != std::string::npos && eq > 0, "--option must be name=value, got \"", o, "\"");
    options[o.substr(0, eq)] = parse_number<int64_t>(o.substr(eq + 1), "--option " + o.substr(0, eq));
  }
  const Trajectories data = collect(args.env, options, parse_policy_mix(args.policy, args.epsilon), args.episodes, args.seed);
  const uint64_t checksum = save_trajectories(args.out, data);
  const EnvironmentKind& kind = environment_kinds().get(data.env);
  std::unique_ptr<Environment> env = kind.make(data.options);
  double best = 0;
  int64_t steps = 0, top = INT64_MIN;
  std::vector<double> returns;
  std::map<std::string, std::pair<int64_t, double>> by_policy;  // episodes, return sum
  for (const Episode& e : data.episodes) {
    const auto r = static_cast<double>(e.total());
    returns.push_back(r);
    top = std::max(top, e.total());
    steps += static_cast<int64_t>(e.actions.size());
    env->reset(e.seed);
    best += env->best_return();
    auto& p = by_policy[e.policy];
    ++p.first, p.second += r;
  }
  const auto n = static_cast<double>(data.episodes.size());
  const auto [mean, sd] = mean_sd(returns);
  std::string policies;
  for (const auto& [name, p] : by_policy)
    policies += (policies.empty() ? "\"" : ", \"") + name + "\": {\"episodes\": " + std::to_string(p.first) +
                ", \"return_mean\": " + json_number(p.second / static_cast<double>(p.first)) + "}";
  std::printf("{\"env\": \"%s\", \"episodes\": %lld, \"steps\": %lld, \"return_mean\": %s, \"return_sd\": %s, "
              "\"return_max\": %lld, \"best_return_mean\": %s, \"by_policy\": {%s}, \"checksum\": \"%s\"}\n",
              data.env.c_str(), static_cast<long long>(data.episodes.size()), static_cast<long long>(steps),
              json_number(mean).c_str(), json_number(sd).c_str(), static_cast<long long>(top),
              json_number(best / n).c_str(), policies.c_str(), hex64(checksum).c_str());
  return 0;
}

// A run's config fitted to its dataset: the model reads its states, timesteps and actions.
void fit_to(TrainConfig& cfg, const Trajectories& data, const std::string& path) {
  // Before the model is built (its build measures a forward over one window).
  TAPEFORMER_CHECK(cfg.model.block_size <= data.max_steps, "rl train: model.block_size ", cfg.model.block_size,
                   " steps per window is more than any episode of the dataset '", path, "' holds (environment \"",
                   data.env, "\" ends every episode within ", data.max_steps, " steps)");
  cfg.model.arch = "decision_transformer";
  std::string sizes;
  for (int32_t s : data.feature_sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
  cfg.model.options["dt_state_sizes"] = sizes;
  cfg.model.options["dt_max_timestep"] = data.max_steps;
  cfg.model.options["dt_dataset"] = hex64(data.checksum);
  cfg.model.vocab_size = data.actions;
  cfg.data.path = path;
}

// v in consecutive pieces of at most n (the last may be shorter): held-out batches.
template <class T>
std::vector<std::vector<T>> pieces(const std::vector<T>& v, int64_t n) {
  std::vector<std::vector<T>> out;
  for (size_t i = 0; i < v.size(); i += static_cast<size_t>(n))
    out.emplace_back(v.begin() + static_cast<std::ptrdiff_t>(i),
                     v.begin() + static_cast<std::ptrdiff_t>(std::min(v.size(), i + static_cast<size_t>(n))));
  return out;
}

// Action loss and accuracy over batches of episodes' steps (B, K), both per
// counted target: the memory, when given, carried from batch to batch.
struct ActionScore {
  double loss = 0, right = 0, counted = 0;  // loss: summed over the counted targets
  void add(LanguageModel& m, const Batch& b, SegmentMemory* memory) {
    ModelContext ctx;
    ctx.inputs = &b.extra;
    ctx.memory = memory;
    const Var logits = m.forward(b.inputs, ctx);  // (B, K, A)
    double n = 0;
    for (int32_t t : b.targets.data) n += t != kIgnoreTarget;
    loss += cross_entropy(logits, b.targets).item() * n;  // the mean over the batch's n targets
    const Tensor z = logits.value().contiguous();
    const int64_t A = z.dim(2);
    for (size_t i = 0; i < b.targets.data.size(); ++i) {
      if (b.targets.data[i] == kIgnoreTarget) continue;
      const Scalar* row = z.data() + static_cast<int64_t>(i) * A;
      right += std::max_element(row, row + A) - row == b.targets.data[i];
      counted += 1;
    }
  }
  // Per target, so that windows and whole episodes in segments (padded differently) compare.
  TaskEvaluation result() const { return TaskEvaluation{loss / counted, {{"accuracy", right / counted}}}; }
};

// The task: windows of the training episodes, evaluation on every window of
// the held-out ones; with a segment memory, whole episodes in order
// (EpisodeStreams), evaluated alike from an empty memory.
TaskData episode_task(const Trajectories& data, const TrainConfig& cfg) {
  const auto n = static_cast<int64_t>(data.episodes.size());
  TAPEFORMER_CHECK(n >= 2, "rl train: the dataset holds ", n, " episode; training and evaluation need at least 2");
  const int64_t val = std::max<int64_t>(1, n / 10), K = cfg.model.block_size, B = cfg.train.batch_size;
  std::vector<int64_t> train_eps, val_eps;
  for (int64_t i = 0; i < n; ++i) (i < n - val ? train_eps : val_eps).push_back(i);
  const uint64_t batches_seed = stream_seed(cfg.train.seed, TaskStream::batches);
  TaskData task;
  task.name = "rl train";
  task.vocab_size = data.actions;
  task.dropout_seed = stream_seed(cfg.train.seed, TaskStream::dropout);
  if (!memories_on(cfg.model).empty()) {
    auto streams = std::make_unique<EpisodeStreams>(data, train_eps, K, B, batches_seed);
    auto held_out = std::make_shared<std::vector<std::vector<Batch>>>();
    for (const std::vector<int64_t>& group : pieces(val_eps, B)) held_out->push_back(streams->read(group));
    task.batches = std::move(streams);
    task.evaluate = [held_out](LanguageModel& m, bool) {
      ActionScore score;
      for (const std::vector<Batch>& group : *held_out) {
        SegmentMemory memory;
        for (const Batch& b : group) score.add(m, b, &memory);
      }
      return score.result();
    };
    return task;
  }
  auto windows = std::make_unique<EpisodeWindows>(data, train_eps, K, B, batches_seed);
  std::vector<std::pair<int64_t, int64_t>> at;
  for (int64_t e : val_eps)
    for (int64_t s = 0; s < static_cast<int64_t>(data.episodes[static_cast<size_t>(e)].actions.size()); s += K)
      at.emplace_back(e, s);
  auto held_out = std::make_shared<std::vector<Batch>>();
  for (const auto& part : pieces(at, B)) held_out->push_back(windows->windows(part));
  task.batches = std::move(windows);
  task.evaluate = [held_out](LanguageModel& m, bool) {
    ActionScore score;
    for (const Batch& b : *held_out) score.add(m, b, nullptr);
    return score.result();
  };
  return task;
}

int run_rl_train(const RlTrainArgs& args) {
  TAPEFORMER_CHECK(!args.out.empty(), "rl train: name the run's directory with --out DIR");
  const std::string ckpt = args.out + "/checkpoint.bin";
  std::unique_ptr<Trajectories> data;
  std::unique_ptr<Trainer> trainer;
  if (args.resume) {
    TAPEFORMER_CHECK(fs::exists(ckpt), "rl train --resume: '", args.out, "' holds no checkpoint.bin");
    TrainConfig saved = TrainConfig::parse(load_checkpoint(ckpt).config_json, "in checkpoint '" + ckpt + "'");
    const std::string path = args.data.empty() ? saved.data.path : args.data;
    data = std::make_unique<Trajectories>(load_trajectories(path));
    const std::string trained_on = saved.model.option_string("dt_dataset");
    TAPEFORMER_CHECK(trained_on == hex64(data->checksum), "rl train --resume: the dataset '", path, "' has checksum ",
                     hex64(data->checksum), " but the run trained on ", trained_on,
                     ": it changed since (collect it again with the same arguments, or start a new run)");
    trainer = Trainer::resume(args.out, episode_task(*data, saved), [&](TrainConfig& c) {
      for (const std::string& o : args.overrides) {
        const std::string key = o.substr(0, o.find('='));
        TAPEFORMER_CHECK(key_may_change_on_resume(key), "rl train --resume: ", key, " cannot change on resume");
      }
      if (!args.overrides.empty()) c = TrainConfig::parse(c.to_json(), "of the checkpoint", args.overrides);
    });
  } else {
    TAPEFORMER_CHECK(!args.config.empty(), "rl train: --config is required (or --resume to continue a run)");
    TAPEFORMER_CHECK(!args.data.empty(), "rl train: --data names the dataset (", program_name(), " rl collect)");
    TAPEFORMER_CHECK(!fs::exists(ckpt), "'", args.out,
                     "' already holds a checkpoint: continue it with --resume, or choose another --out");
    data = std::make_unique<Trajectories>(load_trajectories(args.data));
    // The model kind first, so that the overrides may set its keys (model.dt_returns) on any config.
    std::vector<std::string> overrides = {"model.arch=decision_transformer"};
    overrides.insert(overrides.end(), args.overrides.begin(), args.overrides.end());
    TrainConfig cfg = TrainConfig::load(args.config, overrides);
    TAPEFORMER_CHECK(cfg.model.arch == "decision_transformer", "rl train trains model.arch \"decision_transformer\"; "
                     "--set asks for \"", cfg.model.arch, "\"");
    TAPEFORMER_CHECK(cfg.eval.mem_len == 0, "rl train evaluates held-out episodes with the model's own memory "
                     "(model.mem_len); eval.mem_len must stay 0, got ", cfg.eval.mem_len);
    fit_to(cfg, *data, args.data);
    trainer = std::make_unique<Trainer>(cfg, args.out, episode_task(*data, cfg));
  }
  const TrainResult r = trainer->run();
  std::printf("%s\n", r.to_json().c_str());
  return 0;
}

int run_rl_eval(const RlEvalArgs& args) {
  TAPEFORMER_CHECK(args.episodes >= 1, "rl eval: --episodes must be >= 1, got ", args.episodes);
  const std::string ckpt = checkpoint_file(args.checkpoint);
  const Checkpoint c = load_checkpoint(ckpt);
  TrainConfig cfg = TrainConfig::parse(c.config_json, "in checkpoint '" + ckpt + "'");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> log(nullptr, std::fclose);
  if (!args.log.empty()) {  // opened before the episodes, so that a bad path costs no rollout
    RunDirectory::check_output("rl eval --log", args.log, {ckpt, cfg.data.path});
    log.reset(std::fopen(args.log.c_str(), "a"));
    TAPEFORMER_CHECK(log != nullptr, "rl eval: cannot append to --log '", args.log, "': ", std::strerror(errno));
  }
  TAPEFORMER_CHECK(cfg.model.arch == "decision_transformer", "rl eval: '", ckpt, "' holds a model.arch \"",
                   cfg.model.arch, "\" run, not one of rl train");
  const Trajectories data = load_trajectories(cfg.data.path);
  TAPEFORMER_CHECK(cfg.model.option_string("dt_dataset") == hex64(data.checksum), "rl eval: the dataset '",
                   cfg.data.path, "' changed since the run trained on it (checksum ", hex64(data.checksum),
                   ", trained on ", cfg.model.option_string("dt_dataset"), ")");
  cfg.model.vocab_size = data.actions;
  const std::unique_ptr<LanguageModel> model = load_checkpoint_model(c, cfg.model, ckpt);
  std::unique_ptr<Environment> env = environment_kinds().get(data.env).make(data.options);
  const auto [least, most] = return_bounds(*env);
  TAPEFORMER_CHECK(args.target_return >= least && args.target_return <= most, "rl eval: --target-return ",
                   args.target_return, " is outside the returns environment \"", data.env, "\" can give: [", least,
                   ", ", most, "] (", env->max_steps(), " steps of rewards in [", env->reward_range().first, ", ",
                   env->reward_range().second, "])");
  const bool returns = cfg.model.option_bool("dt_returns");
  ProgressScope scope("rl eval");  // the episodes' progress on stderr (quick work stays quiet)
  WorkProgress progress("playing " + grouped(args.episodes) + " episodes of \"" + data.env +
                            "\" conditioned on return " + std::to_string(args.target_return),
                        args.episodes, "episodes");
  const auto mean_return = [](double sum, int64_t n) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "mean return %.2f", sum / static_cast<double>(n));
    return std::string(buf);
  };
  std::vector<double> achieved;
  double best = 0, so_far = 0;  // so_far: the returns' sum
  NoGradGuard no_grad;
  for (int64_t i = 0; i < args.episodes; ++i) {
    // Layouts from another stream than rl collect's seeds (seed * 1000003 + i).
    Observation o = env->reset((args.seed ^ 0x5bd1e995ULL) * 998244353ULL + static_cast<uint64_t>(i));
    best += env->best_return();
    auto state = model->make_state(1);
    int64_t to_go = args.target_return, total = 0;  // both stay within return_bounds' span: int32
    int32_t previous = data.actions;
    for (int64_t t = 0;; ++t) {
      ModelInputs in = {{DecisionTransformer::kStates, IndexTensor({1, 1, static_cast<int64_t>(o.size())}, o)},
                        {DecisionTransformer::kTimesteps, IndexTensor({1, 1}, {static_cast<int32_t>(t)})}};
      if (returns) in[DecisionTransformer::kReturns] = IndexTensor({1, 1}, {static_cast<int32_t>(to_go)});
      ModelContext ctx;
      ctx.state = state.get();
      ctx.inputs = &in;
      const Tensor z = model->forward(IndexTensor({1, 1}, {previous}), ctx).value().contiguous();  // (1, 1, A)
      const auto a = static_cast<int32_t>(std::max_element(z.data(), z.data() + z.numel()) - z.data());
      const StepResult r = env->step(a);
      total += r.reward;
      to_go -= r.reward;
      previous = a;
      o = r.observation;
      if (r.done) break;
    }
    achieved.push_back(static_cast<double>(total));
    so_far += static_cast<double>(total);
    progress.update(i + 1, mean_return(so_far, i + 1));
  }
  progress.done(mean_return(so_far, args.episodes));
  const auto [mean, sd] = mean_sd(achieved);
  char line[512];
  std::snprintf(line, sizeof line, "{\"target_return\": %s, \"episodes\": %lld, \"return_mean\": %s, \"return_sd\": %s, "
                "\"best_return_mean\": %s, \"env\": \"%s\"}",
                std::to_string(args.target_return).c_str(), static_cast<long long>(args.episodes),
                json_number(mean).c_str(),
                json_number(sd).c_str(), json_number(best / static_cast<double>(args.episodes)).c_str(), data.env.c_str());
  std::printf("%s\n", line);
  if (log) {
    const bool wrote = std::fprintf(log.get(), "%s\n", line) > 0;
    TAPEFORMER_CHECK(std::fclose(log.release()) == 0 && wrote, "rl eval: writing --log '", args.log, "' failed: ",
                     std::strerror(errno));
  }
  return 0;
}

}  // namespace

Command rl_command() {
  return {"rl", "offline reinforcement learning: rl collect, rl train, rl eval", [](CLI::App& rl) -> CommandRunner {
            auto collect = std::make_shared<RlCollectArgs>();
            auto train = std::make_shared<RlTrainArgs>();
            auto eval = std::make_shared<RlEvalArgs>();
            rl.require_subcommand(1);
            auto* rc = rl.add_subcommand("collect",
                                         "play episodes of an environment with scripted behaviour policies and "
                                                     "write them as a dataset");
            rc->add_option("--env", collect->env, "keys_doors | tmaze")->required();
            rc->add_option("--option", collect->options,
                           "an environment option name=value (tmaze: corridor=30; repeatable)");
            rc->add_option("--policy", collect->policy, "behaviour policies with weights: random, noisy, expert, e.g. "
                                                           "random:0.7,noisy:0.3")
                ->capture_default_str();
            number_option(rc, "--epsilon", collect->epsilon,
                          "noisy: the chance of a random action")->capture_default_str();
            number_option(rc, "--episodes", collect->episodes, "episodes to play", integer_in(1, 1 << 24))
                ->capture_default_str();
            number_option(rc, "--seed", collect->seed,
                          "the episodes' layouts and the policies' draws")->capture_default_str();
            rc->add_option("--out", collect->out, "the dataset file to write")->required();
            auto* rt = rl.add_subcommand("train",
                                         "train a Decision Transformer (or behaviour cloning) on a dataset's episodes");
            rt->add_option("--config", train->config, "training config (model, optimizer, schedule, train, eval)");
            rt->add_option("--data", train->data, "the dataset (rl collect); with --resume, default: the run's");
            rt->add_option("--out", train->out, "run directory")->required();
            rt->add_option("--set", train->overrides, "override a config value (repeatable)");
            rt->add_flag("--resume", train->resume, "continue the run saved in --out");
            auto* re = rl.add_subcommand("eval",
                                         "the trained policy acting in its dataset's environment, conditioned on a "
                                                  "target return");
            re->add_option("--checkpoint", eval->checkpoint, "run directory of rl train")->required();
            number_option(re, "--target-return", eval->target_return,
                          "the return asked for at the first step")->required();
            number_option(re, "--episodes", eval->episodes, "episodes to play", integer_in(1, 1 << 20))
                ->capture_default_str();
            number_option(re, "--seed", eval->seed,
                          "the episodes' layouts (none is in a dataset)")->capture_default_str();
            re->add_option("--log", eval->log,
                           "also append the result line to this file (" + program_name() + " plot --achieved draws it)");
            return [collect, train, eval, rc, rt, re](const CommandContext& ctx) {
              if (*rc) {
                try {
                  return run_rl_collect(*collect);
                } catch (const std::bad_alloc&) {
                  fail("rl collect: out of memory; collect fewer or shorter episodes (--episodes, --option)");
                }
              }
              if (*rt) {
                RlTrainArgs a = *train;
                if (ctx.threads >= 0) a.overrides.push_back("train.threads=" + std::to_string(ctx.threads));
                try {
                  return run_rl_train(a);
                } catch (const std::bad_alloc&) {
                  fail("out of memory; make the model, batch or block size smaller");
                }
              }
              return run_rl_eval(*eval);
            };
          }};
}

}  // namespace tapeformer
