// The pieces of a training run as the Trainer builds and runs them, for the
// Trainer and for tools that drive their own loop (bench/paired_run.cpp):
// the optimizer, learning-rate schedule and shard count a TrainConfig names,
// and one optimizer step.
//
//   std::unique_ptr<Optimizer> opt = make_optimizer(cfg.optimizer, model.named_parameters());
//   std::unique_ptr<Schedule> sched = make_schedule(cfg);
//   DataParallel shards(model, static_cast<int>(shard_count(cfg)));
//   StepResult r = train_step(cfg, step, shards, model.parameters(), *opt, *sched, next_batch, rng);
//
// Parameter groups follow nanoGPT: weight decay on parameters of rank >= 2,
// none on biases and norm gains (optim/optimizer.h decay_groups).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/optim/optimizer.h"
#include "tapeformer/optim/schedule.h"
#include "tapeformer/train/config.h"
#include "tapeformer/train/data_parallel.h"

namespace tapeformer {

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& c, const NamedVars& params);
std::unique_ptr<Schedule> make_schedule(const TrainConfig& c);
// Batch shards of a step (train/data_parallel.h): train.shards, or one per
// thread when it is 0, and never more than the batch has rows.
int64_t shard_count(const TrainConfig& c);

struct StepResult {
  float lr = 0;         // the schedule's lr for this step
  double loss = 0;      // mean loss over the step's micro-batches
  float grad_norm = 0;  // global gradient norm before clipping (NaN when the loss was not finite)
};

// One optimizer step (`step` counts from 0): lr from the schedule,
// train.grad_accum micro-batches from next_batch through the shards (each
// backpropagating loss / grad_accum), the global gradient norm of `params`,
// clipping folded into the update (optimizer.grad_clip; 0 = off), zero-grad.
// When the loss or the norm is not finite the update is skipped and the
// gradients are left as they are: the caller reports the divergence. With a
// segment memory (Transformer-XL) the micro-batches read and carry it in turn.
StepResult train_step(const TrainConfig& c, int64_t step, DataParallel& shards, const std::vector<Var>& params,
                      Optimizer& optimizer, const Schedule& schedule, const std::function<Batch()>& next_batch,
                      Rng& dropout_rng, SegmentMemory* memory = nullptr);

}  // namespace tapeformer
