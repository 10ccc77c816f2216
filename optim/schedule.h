// Learning-rate schedules: small objects mapping a step (0-based) to an lr.
//
//   CosineSchedule s(/*lr=*/1e-3f, /*warmup=*/100, /*decay_iters=*/2000, /*min_lr=*/1e-4f);
//   opt.set_lr(s.lr_at(step));
//
// Warmup and decay follow nanoGPT's get_lr: lr * (step + 1) / (warmup + 1)
// during warmup, min_lr after decay_iters.
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
  float lr_at(int64_t) const override { return lr_; }

 private:
  float lr_;
};

// Linear warmup, then decay from lr to min_lr at decay_iters (linear or cosine).
class WarmupDecaySchedule : public Schedule {
 public:
  enum class Shape { Linear, Cosine };
  WarmupDecaySchedule(Shape shape, float lr, int64_t warmup, int64_t decay_iters, float min_lr);
  float lr_at(int64_t step) const override;

 private:
  Shape shape_;
  float lr_, min_lr_;
  int64_t warmup_, decay_iters_;
};

struct LinearSchedule : WarmupDecaySchedule {
  LinearSchedule(float lr, int64_t warmup, int64_t decay_iters, float min_lr)
      : WarmupDecaySchedule(Shape::Linear, lr, warmup, decay_iters, min_lr) {}
};
struct CosineSchedule : WarmupDecaySchedule {
  CosineSchedule(float lr, int64_t warmup, int64_t decay_iters, float min_lr)
      : WarmupDecaySchedule(Shape::Cosine, lr, warmup, decay_iters, min_lr) {}
};

}  // namespace tapeformer
