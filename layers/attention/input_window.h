// InputWindow: the inference state of attention kinds whose output at a
// position depends on where later tokens fall inside a block or bucket
// (LSH's sorted chunks, Sinkhorn's sorted blocks): it keeps the layer's
// inputs of the last `window` positions, and the kind re-runs its forward
// over them for every new piece, returning the piece's rows.
//
//   Var MyAttention::forward(const Var& x, InferenceState& state) const {
//     check_inference(x);
//     return state_as<InputWindow>(state, "MyAttention", "InputWindow").rerun(*this, x);
//   }
#pragma once

#include <string>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/inference_state.h"

namespace tapeformer {

class InputWindow : public InferenceState {
 public:
  explicit InputWindow(int64_t window) : window_(window) {}  // window <= 0: every position
  std::string name() const override { return "InputWindow"; }
  int64_t length() const override { return seen_; }
  void reset() override {
    x_ = Tensor();
    seen_ = 0;
  }
  // x (B, T, C) appended; the window's inputs (B, held, C).
  Tensor append(const Tensor& x) {
    x_ = x_.defined() ? concat({Var(x_), Var(x)}, 1).value() : x.contiguous();
    seen_ += x.dim(1);
    if (window_ > 0 && x_.dim(1) > window_) x_ = x_.slice(1, x_.dim(1) - window_, x_.dim(1)).contiguous();
    return x_;
  }
  // x (B, T, C) appended, then layer's forward over the whole window (no
  // dropout or noise: inference) -> its last T rows (B, T, C).
  Var rerun(const Attention& layer, const Var& x) {
    const Tensor held = append(x.value());
    Rng unused(0);
    const Var y = layer.forward(Var(held), unused);
    return slice(y, 1, held.dim(1) - x.dim(1), held.dim(1));
  }

 private:
  int64_t window_;
  Tensor x_;
  int64_t seen_ = 0;
};

}  // namespace tapeformer
