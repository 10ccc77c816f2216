// The training loop the synthetic-task programs share (copy_task,
// recall_task): the model, optimizer, schedule and shards of a config, steps
// through train_step, a line of OUT/metrics.jsonl every log.interval steps
// (written by the Trainer's MetricsLog) and an evaluation every
// eval.interval steps (and at the end).
//
//   TaskLoop loop(cfg, out, "copy_task", seed);        // cfg.model.vocab_size set by the caller
//   const TaskLoop::Result r = loop.run([&] { return task.next(); },
//                                       [&](int64_t step, MetricsRecord& m) { m.extra = {{"accuracy", 0.5}}; });
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/train/build.h"
#include "tapeformer/train/metrics.h"

namespace tapeformer {

class TaskLoop {
 public:
  struct Result {
    double train_loss = 0, seconds = 0;
    int64_t steps = 0;      // completed
    bool diverged = false;  // a non-finite loss ended the run (divergence_ok)
  };

  // Weights from Rng(seed), dropout from Rng(seed + 3); the metrics file is OUT/metrics.jsonl.
  TaskLoop(const TrainConfig& cfg, const std::string& out, const char* program, uint64_t seed)
      : cfg_(cfg), program_(program), dropout_rng_(seed + 3) {
    parallel::set_num_threads(static_cast<int>(cfg.train.threads));
    Rng init(seed);
    model = std::make_unique<TransformerLM>(cfg.model, init);
    optimizer_ = make_optimizer(cfg.optimizer, model->named_parameters());
    schedule_ = make_schedule(cfg);
    shards = std::make_unique<DataParallel>(*model, static_cast<int>(shard_count(cfg)));
    std::filesystem::create_directories(out);
    metrics_ = std::make_unique<MetricsLog>(out + "/metrics.jsonl", /*append=*/false);
  }
  TaskLoop(const TaskLoop&) = delete;
  TaskLoop& operator=(const TaskLoop&) = delete;

  // train.max_iters steps on next_batch() (with `memory` carried, when given);
  // evaluate(step, record) fills the evaluation's fields of the metrics line
  // (val_loss, extra). With divergence_ok a non-finite loss or gradient
  // norm ends the run (Result::diverged); otherwise it is an Error.
  Result run(const std::function<Batch()>& next_batch, const std::function<void(int64_t, MetricsRecord&)>& evaluate,
             SegmentMemory* memory = nullptr, bool divergence_ok = false) {
    Result res;
    for (int64_t step = 0; step < cfg_.train.max_iters; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      const StepResult r = train_step(cfg_, step, *shards, model->parameters(), *optimizer_, *schedule_, next_batch,
                                      dropout_rng_, memory);
      res.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      res.train_loss = r.loss;
      const bool finite = std::isfinite(r.loss) && std::isfinite(r.grad_norm);
      if (!finite && divergence_ok) {
        res.diverged = true;
        std::fprintf(stderr, "step %lld: diverged (loss %g, gradient norm %g)\n", static_cast<long long>(step + 1),
                     r.loss, static_cast<double>(r.grad_norm));
        break;
      }
      TAPEFORMER_CHECK(finite, program_, ": training diverged at step ", step + 1, " (loss ", r.loss,
                       ", gradient norm ", r.grad_norm, ")");
      const int64_t done = res.steps = step + 1;
      const bool last = done == cfg_.train.max_iters, eval_now = done % cfg_.eval.interval == 0 || last;
      if (done % cfg_.log.interval != 0 && !eval_now) continue;
      MetricsRecord m;
      m.step = done;
      m.lr = r.lr;
      m.train_loss = r.loss;
      m.grad_norm = r.grad_norm;
      m.elapsed_s = res.seconds;
      m.tokens_per_s = static_cast<double>(done * cfg_.train.batch_size * cfg_.model.block_size *
                                           cfg_.train.grad_accum) / res.seconds;
      if (eval_now) evaluate(done, m);
      metrics_->write(m);
    }
    return res;
  }

  Rng& dropout_rng() { return dropout_rng_; }
  std::unique_ptr<TransformerLM> model;
  std::unique_ptr<DataParallel> shards;

 private:
  TrainConfig cfg_;
  const char* program_;
  Rng dropout_rng_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Schedule> schedule_;
  std::unique_ptr<MetricsLog> metrics_;
};

}  // namespace tapeformer
