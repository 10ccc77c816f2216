// Optimizers over parameter groups, with PyTorch's update rules.
//
//   AdamW opt(decay_groups(model.named_parameters(), /*lr=*/1e-3f, /*weight_decay=*/0.1f),
//             /*beta1=*/0.9f, /*beta2=*/0.99f, /*eps=*/1e-8f);
//   backward(loss);  opt.step();  opt.zero_grad();
//
// Each group has its own lr and weight decay; set_lr() sets every group's lr
// (schedules call it each step). Parameters without a gradient are skipped.
// Each update is one vectorised loop per parameter (parallel over chunks).
// state_tensors() / load_state() carry the moment buffers by parameter name
// ("exp_avg.blocks.0.attn.qkv.weight") so checkpoints resume exactly.
#pragma once

#include <string>
#include <vector>

#include "autograd/var.h"

namespace tapeformer {

struct ParamGroup {
  NamedVars params;
  float lr = 1e-3f;
  float weight_decay = 0.0f;
};

// nanoGPT's grouping: parameters of rank >= 2 (matrices, embeddings) decay,
// rank < 2 (biases, norm gains) do not.
std::vector<ParamGroup> decay_groups(const NamedVars& params, float lr, float weight_decay);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  void step();
  void zero_grad();
  void set_lr(float lr);
  float lr() const;
  int64_t step_count() const { return steps_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }

  NamedTensors state_tensors() const;
  // Validates names and shapes (errors name the missing/extra key and shapes).
  void load_state(const NamedTensors& state, int64_t step_count);

 protected:
  // `buffers` names the per-parameter state ("exp_avg", ...), zero-initialised.
  Optimizer(std::vector<ParamGroup> groups, std::vector<std::string> buffers, const char* name);
  // Updates p (contiguous, n elements) from g; state points at its buffers.
  virtual void update(const ParamGroup& group, Scalar* p, const Scalar* g, std::vector<Scalar*>& state,
                      int64_t n) = 0;
  const char* name_;

 private:
  std::vector<ParamGroup> groups_;
  std::vector<std::string> buffer_names_;
  std::vector<std::vector<std::vector<Tensor>>> state_;  // [group][param][buffer]
  int64_t steps_ = 0;
};

// p -= lr * d, d = g + wd p, with momentum: buf = mu buf + (1 - dampening) d
// (buf = d on the first step), d = nesterov ? d + mu buf : buf.
class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, float momentum = 0, float dampening = 0, bool nesterov = false);

 private:
  void update(const ParamGroup& g, Scalar* p, const Scalar* grad, std::vector<Scalar*>& st, int64_t n) override;
  float momentum_, dampening_;
  bool nesterov_;
};

// Adam with L2 decay added to the gradient (torch.optim.Adam):
// m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2,
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
class Adam : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> groups, float beta1 = 0.9f, float beta2 = 0.999f, float eps = 1e-8f);

 protected:
  Adam(std::vector<ParamGroup> groups, float beta1, float beta2, float eps, bool decoupled, const char* name);

 private:
  void update(const ParamGroup& g, Scalar* p, const Scalar* grad, std::vector<Scalar*>& st, int64_t n) override;
  float beta1_, beta2_, eps_;
  bool decoupled_;
};

// AdamW (torch.optim.AdamW): p *= 1 - lr * wd, then the Adam update without L2.
class AdamW : public Adam {
 public:
  AdamW(std::vector<ParamGroup> groups, float beta1 = 0.9f, float beta2 = 0.999f, float eps = 1e-8f);
};

}  // namespace tapeformer
