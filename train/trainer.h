// Trainer: config -> tokenizer + model + optimizer + data, then the loop.
//
//   TrainConfig cfg = TrainConfig::load("configs/shakespeare_char_cpu.json");
//   cfg.data.path = "input.txt";
//   Trainer trainer(cfg, "out/run1");          // or Trainer::resume("out/run1")
//   TrainResult r = trainer.run();             // r.val_loss, r.tokens_per_s, ...
//
// Or on batches a program makes (a synthetic task, TaskData below) with the
// program's own evaluation: Trainer trainer(cfg, "out/copy", std::move(task)).
//
// Each step: lr from the schedule; grad_accum micro-batches of forward,
// cross-entropy, backward (loss / grad_accum); global-norm clipping; optimizer
// step; zero-grad. Every log.interval steps a line goes to OUT/metrics.jsonl
// and the progress display; every eval.interval steps (and at the end) the
// model is evaluated on a fixed set of validation batches; every
// checkpoint.interval steps (and at the end) OUT/checkpoint.bin is written
// atomically, and only from weights a run can continue from (finite, and
// still giving a finite loss on the step's batch). A non-finite loss,
// gradient or weights end the run with Diverged; the last checkpoint stays.
// Resuming restores model, optimizer, step, dropout RNG, sampler position,
// memories and the last loss, so the curve continues exactly (same total
// number of shards, train.shards x processes; any thread count). The
// writing process holds OUT/train.lock (train/run_lock.h) while it lives.
// While run() runs, SIGTERM, SIGINT and SIGHUP (the last two unless the
// process ignores them) stop it cleanly: the step in progress completes, a
// checkpoint of it is written and run() throws Interrupted; the previous
// signal actions are restored.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/data/sampler.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/train/config.h"
#include "tapeformer/core/program_name.h"
#include "tapeformer/train/signals.h"
#include "tapeformer/train/streams.h"

namespace tapeformer {

struct TrainResult {
  int64_t steps = 0;
  double train_loss = 0;     // mean loss of the last step
  double val_loss = 0;       // final evaluation (eval.final_iters batches), nats per token;
                             // to_json() adds bits per character (val_bpc) and perplexity (per token)
  double val_tokens_per_char = 1;  // of the val split: val_bpc = val_loss / ln 2 * val_tokens_per_char
  double val_bpc() const;
  double train_seconds = 0;  // training-loop wall time, evaluation excluded
  double tokens_per_s = 0;   // batch * block * grad_accum * steps / train_seconds
  int64_t parameters = 0;
  int shards = 1;            // data-parallel batch shards, over all processes (train.shards each)
  int ranks = 1;             // processes of a distributed run (mpirun -np)
  std::vector<std::pair<std::string, double>> val_fields;  // a task's own final figures (TaskEvaluation)
  std::string to_json() const;  // one line
};

// A task's evaluation: the mean loss (nats per counted target) and the
// program's own figures (accuracy), written into metrics.jsonl.
struct TaskEvaluation {
  double loss = 0;
  std::vector<std::pair<std::string, double>> fields;
};

// A run on batches a program makes instead of a corpus (the synthetic tasks
// of examples/copy_task and recall_task): no tokenizer, the program's
// vocabulary and its own evaluation. Everything else (model kinds,
// optimizer, schedule, shards, segment memory, metrics, checkpoints,
// signals, resume) is the corpus run's.
//
//   TaskData task;
//   task.name = "copy_task";
//   task.vocab_size = copy.vocab_size();
//   task.batches = std::make_unique<CopyTask>(task_cfg, batch, seed);
//   task.evaluate = [&](LanguageModel& m, bool final) { return TaskEvaluation{loss, {{"accuracy", acc}}}; };
//   Trainer trainer(cfg, "out/copy", std::move(task));   // or Trainer::resume("out/copy", std::move(task))
struct TaskData {
  std::string name;        // the program, in errors
  int64_t vocab_size = 0;  // model.vocab_size
  std::unique_ptr<BatchSource> batches;  // training batches; their position is saved in the checkpoint
  // Batches read forward only, with no gradient and no optimizer step, before
  // the first step of a fresh run: they fill the segment memory of a task
  // whose first targets need earlier segments.
  int64_t warmup_batches = 0;
  // Every eval.interval steps (final = false) and at the end (final = true),
  // in eval mode with no gradient.
  std::function<TaskEvaluation(LanguageModel& model, bool final)> evaluate;
  // The dropout stream's seed (it also draws LSH's training rotations);
  // default: derived from train.seed, as in a corpus run.
  std::optional<uint64_t> dropout_seed;
};

// What Trainer::run throws when the loss or the gradient norm is not
// finite; the last checkpoint is untouched.
class Diverged : public Error {
 public:
  Diverged(const std::string& message, int64_t step, double train_seconds);
  int64_t step() const { return step_; }                  // the step that diverged (steps before it completed)
  double train_seconds() const { return train_seconds_; }  // training-loop time until then

 private:
  int64_t step_;
  double train_seconds_;
};

class Trainer {
 public:
  // A fresh run writing into out_dir (created if missing).
  Trainer(TrainConfig cfg, std::string out_dir);
  // A fresh run on a program's task (cfg.data is not read).
  Trainer(TrainConfig cfg, std::string out_dir, TaskData task);
  // Continues the run saved in out_dir/checkpoint.bin. `adjust`, when set,
  // receives the checkpoint's config and may change it (and reject changes)
  // before anything is built.
  static std::unique_ptr<Trainer> resume(const std::string& out_dir,
                                         const std::function<void(TrainConfig&)>& adjust = {});
  // What a resume starts from. `started` is false for a checkpoint no step
  // was trained from yet (no optimizer state: `import-hf`'s run): then every
  // setting but the model's may change (adopt_resume_config), and the
  // optimizer, batch sampler and dropout draws start as a fresh run's.
  struct ResumePoint {
    int64_t step = 0;
    bool started = true;
  };
  static std::unique_ptr<Trainer> resume(const std::string& out_dir,
                                         const std::function<void(TrainConfig&, const ResumePoint&)>& adjust);
  // Continues a task's run; `task` must be built as the fresh run's was.
  static std::unique_ptr<Trainer> resume(const std::string& out_dir, TaskData task,
                                         const std::function<void(TrainConfig&)>& adjust = {});
  ~Trainer();

 private:
  static std::unique_ptr<Trainer> resume_run(const std::string& out_dir, TaskData task,
                                             const std::function<void(TrainConfig&, const ResumePoint&)>& adjust);

 public:

  TrainResult run();
  // With `on`, run() times its steps by phase and kernel family and counts
  // their allocations (train/profile_report.h), prints the table on stderr
  // at the end and writes OUT/profile.json. Results are unchanged.
  void set_profile(bool on);
  // With `on`, run() shows no progress on stderr (a program's own check of a kind).
  void set_quiet(bool on);
  const TrainConfig& config() const;
  LanguageModel& model();  // the trained model (a task's program evaluates it further)

 private:
  Trainer() = default;
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace tapeformer
