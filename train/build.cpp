#include "train/build.h"

#include <algorithm>

#include "core/parallel.h"

namespace tapeformer {

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& c, const NamedVars& params) {
  const float lr = static_cast<float>(c.lr), wd = static_cast<float>(c.weight_decay);
  if (c.name == "sgd")
    return std::make_unique<SGD>(decay_groups(params, lr, wd), static_cast<float>(c.momentum), 0.0f, c.nesterov);
  const auto b1 = static_cast<float>(c.betas[0]), b2 = static_cast<float>(c.betas[1]), eps = static_cast<float>(c.eps);
  if (c.name == "adam") return std::make_unique<Adam>(decay_groups(params, lr, wd), b1, b2, eps);
  return std::make_unique<AdamW>(decay_groups(params, lr, wd), b1, b2, eps);
}

std::unique_ptr<Schedule> make_schedule(const TrainConfig& c) {
  const auto lr = static_cast<float>(c.optimizer.lr), min_lr = static_cast<float>(c.schedule.min_lr);
  if (c.schedule.name == "constant") return std::make_unique<ConstantSchedule>(lr);
  if (c.schedule.name == "linear")
    return std::make_unique<LinearSchedule>(lr, c.schedule.warmup_iters, c.schedule.decay_iters, min_lr);
  return std::make_unique<CosineSchedule>(lr, c.schedule.warmup_iters, c.schedule.decay_iters, min_lr);
}

int64_t shard_count(const TrainConfig& c) {
  const int64_t wanted = c.train.shards > 0 ? c.train.shards : parallel::num_threads();
  return std::min(wanted, c.train.batch_size);
}

}  // namespace tapeformer
