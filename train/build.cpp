#include "tapeformer/train/build.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "tapeformer/core/parallel.h"
#include "tapeformer/core/profile.h"
#include "tapeformer/optim/clip.h"

namespace tapeformer {

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& c, const NamedVars& params) {
  return optimizer_kinds().get(c.name).make(c, params);
}

std::unique_ptr<Schedule> make_schedule(const TrainConfig& c) { return schedule_kinds().get(c.schedule.name).make(c); }

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
  for (int64_t micro = 0; micro < c.train.grad_accum; ++micro) {
    Batch batch;
    {
      const profile::Scope timed("data", profile::Kind::Phase);
      batch = next_batch();
    }
    loss_sum += shards.train_batch(batch, 1.0f / static_cast<float>(c.train.grad_accum), dropout_rng, memory);
  }
  r.loss = loss_sum / static_cast<double>(c.train.grad_accum);
  if (!std::isfinite(r.loss)) {
    r.grad_norm = std::nanf("");
    return r;
  }
  {
    const profile::Scope timed("gradient norm", profile::Kind::Phase);
    r.grad_norm = grad_norm(params);
  }
  if (!std::isfinite(r.grad_norm)) return r;
  const profile::Scope timed("optimizer", profile::Kind::Phase);
  // Clipping is folded into the update: the optimizer reads g * coef.
  optimizer.step(c.optimizer.grad_clip > 0 ? clip_coefficient(r.grad_norm, static_cast<float>(c.optimizer.grad_clip))
                                           : 1.0f);
  optimizer.zero_grad();
  shards.optimizer_stepped(step + 1);  // layers that move between steps (FAVOR+ redraws), replicas synced
  return r;
}

}  // namespace tapeformer
