#include "tapeformer/train/build.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "tapeformer/core/parallel.h"
#include "tapeformer/core/profile.h"
#include "tapeformer/optim/clip.h"

namespace tapeformer {

Registry<OptimizerKind>& optimizer_kinds() {
  const auto adam_args = [](const OptimizerConfig& c) {
    return std::make_tuple(static_cast<float>(c.betas[0]), static_cast<float>(c.betas[1]), static_cast<float>(c.eps));
  };
  const auto groups = [](const OptimizerConfig& c, const NamedVars& params) {
    return decay_groups(params, static_cast<float>(c.lr), static_cast<float>(c.weight_decay));
  };
  static Registry<OptimizerKind> kinds(
      "optimizer.name",
      {{"adamw", "Adam with decoupled weight decay",
        [=](const OptimizerConfig& c, const NamedVars& params) -> std::unique_ptr<Optimizer> {
          const auto [b1, b2, eps] = adam_args(c);
          return std::make_unique<AdamW>(groups(c, params), b1, b2, eps);
        }},
       {"adam", "Adam, weight decay as L2 in the gradient",
        [=](const OptimizerConfig& c, const NamedVars& params) -> std::unique_ptr<Optimizer> {
          const auto [b1, b2, eps] = adam_args(c);
          return std::make_unique<Adam>(groups(c, params), b1, b2, eps);
        }},
       {"sgd", "SGD with momentum (optionally Nesterov)",
        [=](const OptimizerConfig& c, const NamedVars& params) -> std::unique_ptr<Optimizer> {
          return std::make_unique<SGD>(groups(c, params), static_cast<float>(c.momentum), 0.0f, c.nesterov);
        }}});
  return kinds;
}

Registry<ScheduleKind>& schedule_kinds() {
  // The schedules' common arguments: peak lr, warmup, decay end, floor.
  using Args = std::tuple<float, int64_t, int64_t, float>;
  const auto args = [](const TrainConfig& c) {
    return Args{static_cast<float>(c.optimizer.lr), c.schedule.warmup_iters, c.schedule.decay_iters,
                static_cast<float>(c.schedule.min_lr)};
  };
  const auto warmup_decay = [args](auto make) {
    return [args, make](const TrainConfig& c) -> std::unique_ptr<Schedule> { return std::apply(make, args(c)); };
  };
  static Registry<ScheduleKind> kinds(
      "schedule.name",
      {{"constant", "optimizer.lr throughout",
        [](const TrainConfig& c) -> std::unique_ptr<Schedule> {
          return std::make_unique<ConstantSchedule>(static_cast<float>(c.optimizer.lr));
        }},
       {"linear", "warmup, then linear decay to min_lr at decay_iters",
        warmup_decay([](float lr, int64_t w, int64_t d, float m) { return std::make_unique<LinearSchedule>(lr, w, d, m); })},
       {"cosine", "warmup, then cosine decay to min_lr at decay_iters",
        warmup_decay([](float lr, int64_t w, int64_t d, float m) { return std::make_unique<CosineSchedule>(lr, w, d, m); })},
       {"step", "warmup, lr, then min_lr from decay_iters",
        warmup_decay([](float lr, int64_t w, int64_t d, float m) { return std::make_unique<StepSchedule>(lr, w, d, m); })}});
  return kinds;
}

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
