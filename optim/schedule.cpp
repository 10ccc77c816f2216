#include "optim/schedule.h"

#include <cmath>

#include "core/error.h"

namespace tapeformer {

ConstantSchedule::ConstantSchedule(float lr) : lr_(lr) {
  TAPEFORMER_CHECK(lr >= 0, "ConstantSchedule: lr must be >= 0, got ", lr);
}

WarmupDecaySchedule::WarmupDecaySchedule(Shape shape, float lr, int64_t warmup, int64_t decay_iters, float min_lr)
    : shape_(shape), lr_(lr), min_lr_(min_lr), warmup_(warmup), decay_iters_(decay_iters) {
  TAPEFORMER_CHECK(lr >= 0 && min_lr >= 0 && min_lr <= lr, "schedule: need 0 <= min_lr <= lr, got min_lr ",
                   min_lr, ", lr ", lr);
  TAPEFORMER_CHECK(warmup >= 0 && decay_iters >= warmup, "schedule: need 0 <= warmup (", warmup,
                   ") <= decay_iters (", decay_iters, ")");
}

float WarmupDecaySchedule::lr_at(int64_t step) const {
  if (step < warmup_) return lr_ * static_cast<float>(step + 1) / static_cast<float>(warmup_ + 1);
  if (step > decay_iters_) return min_lr_;
  const double span = static_cast<double>(decay_iters_ - warmup_);
  const double ratio = span > 0 ? static_cast<double>(step - warmup_) / span : 1.0;
  const double coeff = shape_ == Shape::Cosine ? 0.5 * (1.0 + std::cos(M_PI * ratio)) : 1.0 - ratio;
  return static_cast<float>(min_lr_ + coeff * (lr_ - min_lr_));
}

}  // namespace tapeformer
