// InputWindow: the inference state of attention kinds whose output at a
// position depends on where later tokens fall inside a block or bucket
// (LSH's sorted chunks, Sinkhorn's sorted blocks): it keeps the layer's
// inputs of the last `window` positions, and the kind re-runs its forward
// over them for every new piece, returning the piece's rows.
//
// RerunsWindow: the ProjectedAttention base of such a kind. It gives the
// kind's make_state() (an InputWindow) and inference forward (the re-run);
// the kind writes forward(x, rng) and says `using RerunsWindow::forward;` so
// that its own forward does not hide the inference one.
//
//   class MyAttention : public RerunsWindow {
//    public:
//     using RerunsWindow::forward;
//     Var forward(const Var& x, Rng& rng) const override;
//   };
#pragma once

#include <algorithm>
#include <memory>
#include <string>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/projected.h"
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

class RerunsWindow : public ProjectedAttention {
 public:
  using ProjectedAttention::ProjectedAttention;
  using ProjectedAttention::forward;

  // An InputWindow of the last `window` positions (all, for -1), at most
  // rerun_limit() of them; batch >= 1.
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const override {
    TAPEFORMER_CHECK(batch >= 1, who_, ": batch size must be >= 1, got ", batch);
    const int64_t most = rerun_limit();
    if (most > 0) window = window > 0 ? std::min(window, most) : most;
    return std::make_unique<InputWindow>(window);
  }
  // x (B, T, C) joins the window, and forward(x, rng) re-runs over all of it -> x's rows (B, T, C).
  Var forward(const Var& x, InferenceState& state) const override {
    check_inference(x);
    return state_as<InputWindow>(state, who_, "InputWindow").rerun(*this, x);
  }

 protected:
  // The most positions one forward takes (Sinkhorn's sorting network is
  // sized for model.block_size); 0: no limit.
  virtual int64_t rerun_limit() const { return 0; }
};

}  // namespace tapeformer
