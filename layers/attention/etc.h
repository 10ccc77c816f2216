// ETC global-local attention (Ainslie et al. 2020), the "etc" attention kind,
// in the causal form a language model needs. The sequence is cut into
// segments of s positions (model.etc_segment); each complete segment has a
// global token that summarises it, and a local token attends, in one
// softmax, to the globals of the segments complete before its own (l2g) and
// to the locals within a radius r behind it (l2l, model.etc_radius):
//
//   global s (g2l): a_sj = softmax_{j in segment s}(q_g . k_j / sqrt(D)),  K_s = sum_j a_sj k_j,  V_s = sum_j a_sj v_j
//   local i:       y_i = softmax over {global s : s < i / s} and {j : i - r <= j <= i} of
//                        (q_i . k / sqrt(D) + b_h[label]) times V_s or v_j
//   q_g = (e W_qkv)_q per head, e (C) the layer's learned global-token embedding
//   labels: i - j for l2l (0 .. r), r + 1 for every global
//
// A global token reads only its own, complete segment, so every output is
// strictly causal. Departures from the encoder of the paper, said in
// docs/math.md: the global tokens are recomputed in each layer from that
// layer's input (a global's state would otherwise have to travel through
// the block stack beside the locals'), so there is no g2g piece; and the
// relative position labels are a learned scalar per head and label (the
// kernel's learned score terms), not key vectors. Positional schemes that
// act on the pair's positions (rotations, biases) are refused: a global's
// key pools a segment and has no one position. model.etc_segment = 0: no
// global tokens, sliding-window attention of radius r. Generation re-runs
// the window (RerunsWindow), since a new token completes segments and their
// globals join.
#pragma once

#include <memory>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/input_window.h"
#include "tapeformer/layers/attention/projected.h"
#include "tapeformer/layers/attention/tile_cache.h"

namespace tapeformer {

// q, k, v (B, H, T, D) locals, q_g (H, D) the global query, labels (H, r + 2)
// the label biases; segment s (0: no globals), radius r -> (B, H, T, D).
Var etc_attention(const Var& q, const Var& k, const Var& v, const Var& q_g, const Var& labels, int64_t segment,
                  int64_t radius, float p = 0, Rng* rng = nullptr, const TileCache* tiles = nullptr);

class EtcAttention : public RerunsWindow {
 public:
  EtcAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng);
  using RerunsWindow::forward;
  Var forward(const Var& x, Rng& rng) const override;  // (B, T, C) -> (B, T, C)

  int64_t segment, radius;  // s (0: no globals), r
  Var global;               // e (C): the global token's embedding
  Var labels;               // (H, r + 2): l2l by distance 0 .. r, then l2g

 private:
  TileCache tiles_;
};

}  // namespace tapeformer
