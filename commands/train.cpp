// `tapeformer train`: a run from a JSON config, or --resume of one.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "tapeformer/commands/command.h"
#include "tapeformer/core/error.h"
#include "tapeformer/train/config.h"
#include "tapeformer/train/process_group.h"
#include "tapeformer/train/run_directory.h"
#include "tapeformer/train/trainer.h"

namespace tapeformer {
namespace {
namespace fs = std::filesystem;

struct TrainArgs {
  std::string config;                  // JSON config; optional with resume
  std::string data;                    // overrides data.path when set
  std::string out = "out";             // run directory
  std::vector<std::string> overrides;  // key=value
  bool resume = false;
  bool profile = false;  // Trainer::set_profile
};

// Trains (or resumes); prints the final TrainResult JSON line on stdout.
int run_train(const TrainArgs& args) {
  const std::string ckpt = (fs::path(args.out) / "checkpoint.bin").string();
  for (const char* name : {"checkpoint.bin", "metrics.jsonl", "profile.json"})
    RunDirectory::check_not_input("train", (fs::path(args.out) / name).string(), {args.config, args.data});
  std::unique_ptr<Trainer> trainer;
  if (args.resume) {
    TAPEFORMER_CHECK(fs::exists(ckpt), "--resume: no checkpoint at '", ckpt, "'");
    trainer = Trainer::resume(args.out, [&](TrainConfig& saved, const Trainer::ResumePoint& point) {
      TrainConfig wanted = args.config.empty() ? TrainConfig::parse(saved.to_json(), "of the checkpoint", args.overrides)
                                               : TrainConfig::load(args.config, args.overrides);
      if (!args.data.empty()) wanted.data.path = args.data;
      if (wanted.data.path.empty()) wanted.data.path = saved.data.path;
      wanted.validate();  // --data may be a path a checkpoint cannot store
      adopt_resume_config(saved, wanted, args.out, point.started);
    });
  } else {
    TAPEFORMER_CHECK(!args.config.empty(), "train: --config is required (or --resume to continue a run)");
    TAPEFORMER_CHECK(!fs::exists(ckpt), "'", args.out,
                     "' already holds a checkpoint: continue it with --resume, or choose another --out");
    TrainConfig cfg = TrainConfig::load(args.config, args.overrides);
    if (!args.data.empty()) cfg.data.path = args.data;
    trainer = std::make_unique<Trainer>(cfg, args.out);
    // Checked again under the run lock: a run that ended meanwhile may have saved one.
    TAPEFORMER_CHECK(!fs::exists(ckpt), "'", args.out,
                     "' already holds a checkpoint: continue it with --resume, or choose another --out");
  }
  trainer->set_profile(args.profile);
  const TrainResult r = trainer->run();
  const std::shared_ptr<ProcessGroup> group = ProcessGroup::world();
  if (group && group->rank() != 0) return 0;  // rank 0 prints the run's result
  std::printf("%s\n", r.to_json().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

Command train_command() {
  return {"train", "train a model from a JSON config", [](CLI::App& t) -> CommandRunner {
            auto args = std::make_shared<TrainArgs>();
            t.add_option("--config", args->config, "JSON config (configs/*.json); optional with --resume");
            t.add_option("--data", args->data, "text file to train on (overrides data.path)");
            t.add_option("--out", args->out, "output directory for checkpoint.bin and metrics.jsonl")
                ->capture_default_str();
            t.add_option("--set", args->overrides, "override a config value: --set train.max_iters=500 (repeatable)");
            t.add_flag("--resume", args->resume, "continue the run saved in --out");
            t.add_flag("--profile", args->profile,
                       "time the steps by phase and kernel, count their allocations; print the table at the end and "
                       "write it to OUT/profile.json");
            return [args](const CommandContext& ctx) {
              TrainArgs a = *args;
              if (ctx.threads >= 0) a.overrides.push_back("train.threads=" + std::to_string(ctx.threads));
              try {
                return run_train(a);
              } catch (const std::bad_alloc&) {
                fail("out of memory; make the model, batch or block size smaller");
              }
            };
          }};
}

}  // namespace tapeformer
