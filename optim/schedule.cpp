#include "tapeformer/optim/schedule.h"

#include <cmath>

#include "tapeformer/core/error.h"

namespace tapeformer {
namespace {

constexpr double kPi = 3.14159265358979323846;

const char* schedule_name(WarmupDecaySchedule::Shape shape) {
  switch (shape) {
    case WarmupDecaySchedule::Shape::Cosine: return "CosineSchedule";
    case WarmupDecaySchedule::Shape::Linear: return "LinearSchedule";
    case WarmupDecaySchedule::Shape::Step: return "StepSchedule";
  }
  return "Schedule";
}

void check_step(const char* name, int64_t step) {
  TAPEFORMER_CHECK(step >= 0, name, ": step must be >= 0, got ", step);
}

}  // namespace

ConstantSchedule::ConstantSchedule(float lr) : lr_(lr) {
  TAPEFORMER_CHECK(std::isfinite(lr) && lr >= 0, "ConstantSchedule: lr must be finite and >= 0, got ", lr);
}

float ConstantSchedule::lr_at(int64_t step) const {
  check_step("ConstantSchedule", step);
  return lr_;
}

WarmupDecaySchedule::WarmupDecaySchedule(Shape shape, float lr, int64_t warmup_iters, int64_t decay_iters,
                                         float min_lr)
    : shape_(shape), lr_(lr), min_lr_(min_lr), warmup_(warmup_iters), decay_iters_(decay_iters) {
  const char* name = schedule_name(shape);
  TAPEFORMER_CHECK(std::isfinite(lr) && lr >= 0, name, ": lr must be finite and >= 0, got ", lr);
  TAPEFORMER_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr, name, ": min_lr (", min_lr,
                   ") must be in [0, lr (", lr, ")]");
  TAPEFORMER_CHECK(warmup_iters >= 0, name, ": warmup_iters must be >= 0, got ", warmup_iters);
  TAPEFORMER_CHECK(warmup_iters <= decay_iters, name, ": warmup_iters (", warmup_iters,
                   ") must be <= decay_iters (", decay_iters, ")");
}

float WarmupDecaySchedule::lr_at(int64_t step) const {
  check_step(schedule_name(shape_), step);
  if (step < warmup_) return static_cast<float>(lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_ + 1));
  if (shape_ == Shape::Step) return static_cast<float>(step < decay_iters_ ? lr_ : min_lr_);
  if (step > decay_iters_) return static_cast<float>(min_lr_);
  const double span = static_cast<double>(decay_iters_ - warmup_);
  const double ratio = span > 0 ? static_cast<double>(step - warmup_) / span : 1.0;
  const double coeff = shape_ == Shape::Cosine ? 0.5 * (1.0 + std::cos(kPi * ratio)) : 1.0 - ratio;
  return static_cast<float>(min_lr_ + coeff * (lr_ - min_lr_));
}

}  // namespace tapeformer
