// Trainer: config -> tokenizer + model + optimizer + data, then the loop.
//
//   TrainConfig cfg = TrainConfig::load("configs/shakespeare_char_cpu.json");
//   cfg.data.path = "input.txt";
//   Trainer trainer(cfg, "out/run1");          // or Trainer::resume("out/run1")
//   TrainResult r = trainer.run();             // r.val_loss, r.tokens_per_s, ...
//
// Each step: lr from the schedule; grad_accum micro-batches of forward,
// cross-entropy, backward (loss / grad_accum); global-norm clipping; optimizer
// step; zero-grad. Every log.interval steps a line goes to OUT/metrics.jsonl
// and the progress display; every eval.interval steps (and at the end) the
// model is evaluated on a fixed set of validation batches; every
// checkpoint.interval steps (and at the end) OUT/checkpoint.bin is written
// atomically. A non-finite loss stops the run with an Error; the last
// checkpoint is untouched. Resuming restores model, optimizer, step, dropout
// RNG and sampler position, so the curve continues exactly (same total
// number of shards, train.shards x processes; any thread count).
// While run() runs, SIGTERM and SIGINT (unless the process ignores it) stop
// it cleanly: the step in progress completes, a checkpoint of it is written
// and run() throws Interrupted; the previous signal actions are restored.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "tapeformer/core/error.h"
#include "tapeformer/train/config.h"

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
  std::string to_json() const;  // one line
};

// What Trainer::run throws after SIGINT or SIGTERM, once the checkpoint is saved.
class Interrupted : public Error {
 public:
  Interrupted(const std::string& message, int signal);
  int signal() const { return signal_; }

 private:
  int signal_;
};

class Trainer {
 public:
  // A fresh run writing into out_dir (created if missing).
  Trainer(TrainConfig cfg, std::string out_dir);
  // Continues the run saved in out_dir/checkpoint.bin. `adjust`, when set,
  // receives the checkpoint's config and may change it (and reject changes)
  // before anything is built.
  static std::unique_ptr<Trainer> resume(const std::string& out_dir,
                                         const std::function<void(TrainConfig&)>& adjust = {});
  ~Trainer();

  TrainResult run();
  // With `on`, run() times its steps by phase and kernel family and counts
  // their allocations (train/profile_report.h), prints the table on stderr
  // at the end and writes OUT/profile.json. Results are unchanged.
  void set_profile(bool on);
  const TrainConfig& config() const;

 private:
  Trainer() = default;
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace tapeformer
