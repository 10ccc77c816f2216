// The optimizer, learning-rate schedule and shard count a TrainConfig names, built the way
// the Trainer builds them (also for tools that run their own loop, such as
// bench/paired_run.cpp).
//
//   std::unique_ptr<Optimizer> opt = make_optimizer(cfg.optimizer, model.named_parameters());
//   std::unique_ptr<Schedule> sched = make_schedule(cfg);
//   opt->set_lr(sched->lr_at(step));          // step counts from 0
//
// Parameter groups follow nanoGPT: weight decay on parameters of rank >= 2,
// none on biases and norm gains (optim/optimizer.h decay_groups).
#pragma once

#include <memory>

#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/config.h"

namespace tapeformer {

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& c, const NamedVars& params);
std::unique_ptr<Schedule> make_schedule(const TrainConfig& c);
// Batch shards of a step (train/data_parallel.h): train.shards, or one per
// thread when it is 0, and never more than the batch has rows.
int64_t shard_count(const TrainConfig& c);

}  // namespace tapeformer
