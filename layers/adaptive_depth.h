// AdaptiveDepth: a layer or model whose positions may stop before the last
// layer (early exit, ACT halting) and, reading piece by piece, skip the
// later layers' work for them: those layers take in only what later
// positions read (the keys and values of the stopped state), not the
// attention output or the MLP (Attention::forward_rows).
//
//   model.set_full_depth(true);   // LanguageModel: every such part of the model
//
// With full depth every layer runs for every position and the stopped
// positions' results are discarded: the same numbers, none of the time
// saved (what `tapeformer sample --full-depth` measures the saving against).
#pragma once

namespace tapeformer {

class AdaptiveDepth {
 public:
  virtual ~AdaptiveDepth() = default;
  void set_full_depth(bool full) { full_depth_ = full; }
  bool full_depth() const { return full_depth_; }

 private:
  bool full_depth_ = false;
};

}  // namespace tapeformer
