// Learning-rate schedules: small objects mapping a 0-based step to an lr.
//
//   CosineSchedule s(/*lr=*/1e-3f, /*warmup_iters=*/100, /*decay_iters=*/2000, /*min_lr=*/1e-4f);
//   for (int64_t it = 0; ...; ++it) opt.set_lr(s.lr_at(it));
//
// Linear and cosine follow nanoGPT's get_lr(it) exactly (computed in double):
//   it <  warmup_iters:  lr * (it + 1) / (warmup_iters + 1)
//   it >  decay_iters:   min_lr
//   otherwise, r = (it - warmup_iters) / (decay_iters - warmup_iters) and
//     cosine: min_lr + 0.5 (1 + cos(pi r)) (lr - min_lr)
//     linear: min_lr + (1 - r) (lr - min_lr)
// Step (the copy task of Katharopoulos et al.): the same warmup, then lr
// until decay_iters and min_lr from decay_iters on.
// (r = 1 when warmup_iters == decay_iters, so that step gives min_lr.)
//
// Contract: constructors throw Error naming the schedule and the field
// ("CosineSchedule: warmup_iters (20) must be <= decay_iters (10)");
// lr_at throws for a negative step.
#pragma once

#include <cstdint>

namespace tapeformer {

class Schedule {
 public:
  virtual ~Schedule() = default;
  virtual float lr_at(int64_t step) const = 0;
};

class ConstantSchedule : public Schedule {
 public:
  explicit ConstantSchedule(float lr);
  float lr_at(int64_t step) const override;

 private:
  float lr_;
};

// Linear warmup, then a linear or cosine decay from lr to min_lr at decay_iters.
class WarmupDecaySchedule : public Schedule {
 public:
  enum class Shape { Linear, Cosine, Step };
  WarmupDecaySchedule(Shape shape, float lr, int64_t warmup_iters, int64_t decay_iters, float min_lr);
  float lr_at(int64_t step) const override;

 private:
  Shape shape_;
  double lr_, min_lr_;
  int64_t warmup_, decay_iters_;
};

struct LinearSchedule : WarmupDecaySchedule {
  LinearSchedule(float lr, int64_t warmup_iters, int64_t decay_iters, float min_lr)
      : WarmupDecaySchedule(Shape::Linear, lr, warmup_iters, decay_iters, min_lr) {}
};

struct CosineSchedule : WarmupDecaySchedule {
  CosineSchedule(float lr, int64_t warmup_iters, int64_t decay_iters, float min_lr)
      : WarmupDecaySchedule(Shape::Cosine, lr, warmup_iters, decay_iters, min_lr) {}
};

struct StepSchedule : WarmupDecaySchedule {
  StepSchedule(float lr, int64_t warmup_iters, int64_t decay_iters, float min_lr)
      : WarmupDecaySchedule(Shape::Step, lr, warmup_iters, decay_iters, min_lr) {}
};

}  // namespace tapeformer
