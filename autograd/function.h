// Function: the public way to add an op with a hand-written backward.
//
//   struct Square : Function {
//     const char* name() const override { return "square"; }
//     std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
//       ctx.save_for_backward({in[0]});
//       return {kernels::map(in[0], ...)};                   // y = x^2
//     }
//     std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
//       return {...};                                          // dx = 2 x dy
//     }
//   };
//   Var y = Function::apply<Square>({x})[0];
//
// forward runs with recording off (it may call Var ops freely; they are not
// taped) and returns the outputs. backward receives one gradient per output
// (zeros for outputs that got none) and returns one gradient per input, or an
// undefined Tensor for "no gradient". Gradients are shape-checked by the
// accumulator, which names this Function in its error. backward runs with
// recording off; to differentiate a sub-computation inside it (recomputation
// in reversible blocks), open a TapeScope and call backward() on it.
// The built-in fused attention, linear attention and reversible layers use
// this same API.
//
// Memory layout. An input (and a gradient passed to backward) may be a
// strided view: x.transpose(0, 1), a slice, a broadcast (stride 0). Its
// data() then is not a row-major array of numel() values. Either call
// t.contiguous() first (no copy when t already is contiguous; a row-major
// copy otherwise) and index data() row-major, or walk t.strides(). Outputs
// and returned gradients may be any tensor of the right shape; never write
// into an input, it may share storage with a caller's tensor.
#pragma once

#include <memory>
#include <vector>

#include "tapeformer/autograd/tape.h"
#include "tapeformer/autograd/var.h"

namespace tapeformer {

class Function;

class FunctionContext {
 public:
  void save_for_backward(std::vector<Tensor> tensors) { saved_ = std::move(tensors); }
  const std::vector<Tensor>& saved() const { return saved_; }
  // True when input i requires grad (skip computing its gradient otherwise).
  bool needs_input_grad(size_t i) const { return i < needs_.size() && needs_[i]; }
  size_t num_inputs() const { return needs_.size(); }

 private:
  friend std::vector<Var> apply_function(std::shared_ptr<Function>, const std::vector<Var>&);
  std::vector<Tensor> saved_;
  std::vector<bool> needs_;
};

class Function {
 public:
  virtual ~Function() = default;
  // Used in error messages ("square: gradient of shape ...").
  virtual const char* name() const = 0;
  virtual std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& inputs) = 0;
  virtual std::vector<Tensor> backward(FunctionContext& ctx,
                                       const std::vector<Tensor>& grad_outputs) = 0;

  // Constructs an F from args and applies it to the inputs.
  template <class F, class... Args>
  static std::vector<Var> apply(const std::vector<Var>& inputs, Args&&... args);
};

// Runs f->forward on the inputs' values and records f->backward on the tape.
std::vector<Var> apply_function(std::shared_ptr<Function> f, const std::vector<Var>& inputs);

template <class F, class... Args>
std::vector<Var> Function::apply(const std::vector<Var>& inputs, Args&&... args) {
  return apply_function(std::make_shared<F>(std::forward<Args>(args)...), inputs);
}

}  // namespace tapeformer
