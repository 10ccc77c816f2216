#include "train/build.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "optim/clip.h"

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
  if (c.schedule.name == "step")
    return std::make_unique<StepSchedule>(lr, c.schedule.warmup_iters, c.schedule.decay_iters, min_lr);
  if (c.schedule.name == "linear")
    return std::make_unique<LinearSchedule>(lr, c.schedule.warmup_iters, c.schedule.decay_iters, min_lr);
  return std::make_unique<CosineSchedule>(lr, c.schedule.warmup_iters, c.schedule.decay_iters, min_lr);
}

int64_t shard_count(const TrainConfig& c) {
  const int64_t wanted = c.train.shards > 0 ? c.train.shards : parallel::num_threads();
  return std::min(wanted, c.train.batch_size);
}

StepResult train_step(const TrainConfig& c, int64_t step, DataParallel& shards, const std::vector<Var>& params,
                      Optimizer& optimizer, const Schedule& schedule, const std::function<Batch()>& next_batch,
                      Rng& dropout_rng, SegmentMemory* memory) {
  StepResult r;
  r.lr = schedule.lr_at(step);
  optimizer.set_lr(r.lr);
  double loss_sum = 0;
  for (int64_t micro = 0; micro < c.train.grad_accum; ++micro)
    loss_sum += shards.train_batch(next_batch(), 1.0f / static_cast<float>(c.train.grad_accum), dropout_rng, memory);
  r.loss = loss_sum / static_cast<double>(c.train.grad_accum);
  if (!std::isfinite(r.loss)) {
    r.grad_norm = std::nanf("");
    return r;
  }
  r.grad_norm = grad_norm(params);
  if (!std::isfinite(r.grad_norm)) return r;
  // Clipping is folded into the update: the optimizer reads g * coef.
  optimizer.step(c.optimizer.grad_clip > 0 ? clip_coefficient(r.grad_norm, static_cast<float>(c.optimizer.grad_clip))
                                           : 1.0f);
  optimizer.zero_grad();
  return r;
}

}  // namespace tapeformer
