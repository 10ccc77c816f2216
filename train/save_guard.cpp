#include "tapeformer/train/save_guard.h"

#include <algorithm>
#include <cmath>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"

namespace tapeformer {
namespace {

// The name of the first tensor holding a NaN or an infinity, or "".
std::string first_non_finite(const NamedTensors& tensors) {
  for (const auto& [name, t] : tensors) {
    const Tensor c = t.contiguous();
    const Scalar* p = c.data();
    for (int64_t i = 0; i < c.numel(); ++i)
      if (!std::isfinite(p[i])) return name;
  }
  return "";
}

}  // namespace

std::string unsaveable(double loss, LanguageModel& model, const Optimizer& optimizer, const Batch& last_batch,
                       const Rng& dropout_rng) {
  if (!std::isfinite(loss)) return "the loss is " + std::to_string(loss);
  const std::string weight = first_non_finite(model.state());
  if (!weight.empty()) return "the weights '" + weight + "' are not finite";
  const std::string moment = first_non_finite(optimizer.state_tensors());
  if (!moment.empty()) return "the optimizer state '" + moment + "' is not finite";
  const auto& targets = last_batch.targets.data;
  if (std::all_of(targets.begin(), targets.end(), [](int32_t t) { return t == kIgnoreTarget; })) return "";
  const bool was_training = model.is_training();
  model.eval();
  double probe = 0;
  {
    NoGradGuard no_grad;
    Rng unused = dropout_rng;  // eval mode draws no masks; the training stream stays untouched
    ModelContext ctx;
    ctx.rng = &unused;
    ctx.inputs = last_batch.extra.empty() ? nullptr : &last_batch.extra;
    probe = cross_entropy(model.forward(last_batch.inputs, ctx), last_batch.targets).item();
  }
  model.train(was_training);
  if (!std::isfinite(probe)) return "the updated weights give a loss of " + std::to_string(probe) + " on a batch";
  return "";
}

}  // namespace tapeformer
