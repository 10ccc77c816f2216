#include "tapeformer/autograd/function.h"

#include "tapeformer/core/error.h"

namespace tapeformer {

std::vector<Var> apply_function(std::shared_ptr<Function> f, const std::vector<Var>& inputs) {
  TAPEFORMER_CHECK(f != nullptr, "apply_function: null Function");
  auto ctx = std::make_shared<FunctionContext>();
  std::vector<Tensor> values;
  bool any_requires = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TAPEFORMER_CHECK(inputs[i].defined(), f->name(), ": input ", i, " is undefined");
    values.push_back(inputs[i].value());
    const bool r = grad_enabled() && inputs[i].requires_grad();
    ctx->needs_.push_back(r);
    any_requires = any_requires || r;
  }
  std::vector<Tensor> results;
  {
    NoGradGuard no_grad;
    results = f->forward(*ctx, values);
  }
  std::vector<Var> outputs;
  for (size_t i = 0; i < results.size(); ++i) {
    TAPEFORMER_CHECK(results[i].defined(), f->name(), ": forward returned an undefined output ", i);
    outputs.emplace_back(std::move(results[i]), any_requires);
  }
  if (!any_requires) return outputs;

  current_tape().record([f, ctx, inputs, outputs]() {
    bool any_grad = false;
    std::vector<Tensor> douts;
    for (const Var& out : outputs) {
      any_grad = any_grad || out.has_grad();
      douts.push_back(out.has_grad() ? out.grad() : Tensor::zeros(out.shape()));
    }
    if (!any_grad) return;
    std::vector<Tensor> dins = f->backward(*ctx, douts);
    TAPEFORMER_CHECK(dins.size() == inputs.size(), f->name(), ": backward returned ", dins.size(),
                     " gradients for ", inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (dins[i].defined() && ctx->needs_input_grad(i)) accumulate_grad(inputs[i], dins[i], f->name());
    }
  });
  return outputs;
}

}  // namespace tapeformer
