// Optimizers over parameter groups, with PyTorch's update rules (torch.optim
// 1.13, single-tensor path): SGD (momentum, dampening, Nesterov), Adam (L2
// decay added to the gradient), AdamW (decoupled decay).
//
//   AdamW opt(decay_groups(model.named_parameters(), /*lr=*/1e-3f, /*weight_decay=*/0.1f),
//             /*beta1=*/0.9f, /*beta2=*/0.99f, /*eps=*/1e-8f);
//   for (int64_t it = 0; it < max_iters; ++it) {
//     opt.set_lr(schedule.lr_at(it));
//     backward(loss(...));
//     clip_grad_norm(model.parameters(), 1.0f);
//     opt.step();
//     opt.zero_grad();
//   }
//
// Contract
// - Each group has its own lr and weight decay; set_lr() sets every group's lr.
// - step() updates every parameter that has a gradient; parameters without one
//   are untouched and their state does not advance (as in PyTorch, where a
//   parameter's state, including its step count, only moves when it has a
//   .grad). Gradients must have the parameter's shape; parameter values must
//   be contiguous (checked, Error naming the parameter).
// - A step is one parallel pass over kBlock-element blocks of every
//   parameter's contiguous buffer, so results do not depend on the thread
//   count.
// - State for checkpoints: state_tensors() lists, per parameter in group order,
//   "step.<name>" (rank-0, the number of updates that parameter received, as
//   PyTorch's state['step']) followed by the optimizer's buffers
//   ("momentum_buffer.<name>", or "exp_avg.<name>" and "exp_avg_sq.<name>").
//   Buffer entries alias the live state (clone to snapshot). load_state()
//   validates every name, shape and step before copying anything.
// - Constructors validate hyperparameters and parameters and throw Error
//   naming the field: "AdamW: beta2 must be in [0, 1), got 1".
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/autograd/var.h"

namespace tapeformer {

// Saved state keeps each parameter's step count as a float32 tensor, as
// PyTorch's state['step'] does; beyond 2^24 a float stops counting exactly.
inline constexpr int64_t kMaxOptimizerSteps = int64_t{1} << 24;

struct ParamGroup {
  NamedVars params;  // dotted names are the state keys; each Var at most once
  float lr = 1e-3f;
  float weight_decay = 0.0f;
};

// nanoGPT's configure_optimizers grouping: parameters that require grad and
// have rank >= 2 (matrices, embeddings) get weight_decay; rank < 2 (biases,
// norm gains) get 0. Returns [decay, no_decay], omitting an empty group.
//
//   decay_groups({{"fc.weight", w}, {"fc.bias", b}}, 1e-3f, 0.1f)
//     == {{{"fc.weight", w}}, 1e-3f, 0.1f}, {{{"fc.bias", b}}, 1e-3f, 0.0f}}
std::vector<ParamGroup> decay_groups(const NamedVars& params, float lr, float weight_decay);

class Optimizer {
 public:
  static constexpr int64_t kBlock = 2048;  // elements per update call (L1-sized)
  static constexpr int kMaxBuffers = 2;

  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient; step_count() += 1.
  // Gradients are read multiplied by grad_scale (finite, > 0), as if they had
  // been scaled in place first: pass clip_coefficient(norm, max_norm) to clip
  // without a separate pass over the gradients.
  void step(float grad_scale = 1.0f);
  // Drops every parameter's gradient (Var::zero_grad).
  void zero_grad();
  // Sets every group's lr (finite, >= 0).
  void set_lr(float lr);
  // The first group's lr.
  float lr() const;
  // Number of step() calls (restored by load_state).
  int64_t step_count() const { return steps_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  const std::string& name() const { return name_; }

  NamedTensors state_tensors() const;
  // Restores state saved by state_tensors() of an optimizer of the same kind
  // over parameters of the same names and shapes. Throws Error naming the
  // missing / unexpected / duplicate key or the shapes
  // ("AdamW optimizer state: 'exp_avg.w' has shape [4, 3] vs parameter [3, 4]").
  void load_state(const NamedTensors& state, int64_t step_count);

 protected:
  // A block of one parameter: n contiguous elements of the value, its
  // gradient and its buffers (buffers[b] for buffer_names[b]).
  struct Block {
    Scalar* param;
    const Scalar* grad;  // read as grad[i] * grad_scale
    std::array<Scalar*, kMaxBuffers> buffers;
    int64_t n;
    Scalar grad_scale;
  };

  // `buffer_names` are the per-parameter state tensors, zero-initialised.
  Optimizer(std::string name, std::vector<ParamGroup> groups, std::vector<std::string> buffer_names);
  // Applies one update to a block; `step` is this parameter's update count,
  // already incremented (1 on its first update).
  virtual void update(const ParamGroup& group, int64_t step, const Block& block) const = 0;

 private:
  struct ParamState {
    int64_t step = 0;
    std::vector<Tensor> buffers;
  };
  void check_ready() const;

  std::string name_;
  std::vector<ParamGroup> groups_;
  std::vector<std::string> buffer_names_;
  std::vector<std::vector<ParamState>> state_;  // [group][param]
  int64_t steps_ = 0;
};

// torch.optim.SGD: d = g + wd p; with momentum, buf = d on a parameter's first
// update, else buf = mu buf + (1 - dampening) d; then d = nesterov ? d + mu buf
// : buf; p -= lr d. Buffer: "momentum_buffer" (only when momentum > 0).
class SGD : public Optimizer {
 public:
  explicit SGD(std::vector<ParamGroup> groups, float momentum = 0, float dampening = 0, bool nesterov = false);

 private:
  void update(const ParamGroup& group, int64_t step, const Block& block) const override;
  float momentum_, dampening_;
  bool nesterov_;
};

// torch.optim.Adam: d = g + wd p (L2), m = b1 m + (1-b1) d, v = b2 v + (1-b2) d^2,
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), t = the
// parameter's step. Buffers: "exp_avg", "exp_avg_sq".
class Adam : public Optimizer {
 public:
  explicit Adam(std::vector<ParamGroup> groups, float beta1 = 0.9f, float beta2 = 0.999f, float eps = 1e-8f);

 protected:
  Adam(std::string name, bool decoupled, std::vector<ParamGroup> groups, float beta1, float beta2, float eps);

 private:
  void update(const ParamGroup& group, int64_t step, const Block& block) const override;
  float beta1_, beta2_, eps_;
  bool decoupled_;
};

// torch.optim.AdamW: p *= 1 - lr wd, then the Adam update with d = g.
class AdamW : public Adam {
 public:
  explicit AdamW(std::vector<ParamGroup> groups, float beta1 = 0.9f, float beta2 = 0.999f, float eps = 1e-8f);
};

}  // namespace tapeformer
