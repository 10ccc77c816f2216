// ProjectedAttention: the part every built-in attention kind shares, so a
// kind writes only its inner attention and its inference state.
//
//   q, k, v = split_heads(x W_qkv + b_qkv)     x (B, T, C) -> (B, H, T, D) each, D = C / H
//             shared-QK (Reformer's LSH): W_qk [C, 2C], k = q
//   y       = inner(q, k, v)                   (B, H, T, D), the kind's own
//   out     = drop(merge_heads(y) W_o + b_o)   (B, T, C); W_o starts at the residual init std
//
// A kind derives from it, calls init_projections() where its constructor
// registers the projections (registration order fixes the init draws and
// the checkpoint keys "qkv.*", "proj.*"), and uses heads() and output().
// Its registry entry counts the projections with projection_parameters().
//
// A kind whose inner attention is an op of its own over q and k rotated by
// the positional part (adaptive span, DA) overrides inner_attention() only:
// the two forwards and make_state() below then run it, in training over
// positions 0.. and in inference over a KVCache. Any other kind overrides
// those three itself.
#pragma once

#include <memory>
#include <vector>

#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/basic.h"

namespace tapeformer {

class ProjectedAttention : public Attention {
 public:
  enum class Projection {
    qkv,        // W_qkv [C, 3C]: queries, keys and values
    shared_qk,  // W_qk [C, 2C]: one projection for queries and keys, one for values
  };

  // `who` names the kind in errors; n_embd must be a multiple of n_head.
  ProjectedAttention(const char* who, std::shared_ptr<PositionalLayer> pos, int64_t n_embd, int64_t n_head,
                     float dropout);

  // Parameters of the projections of a layer of `cfg`: (4 C^2 + 4 C) for qkv,
  // (3 C^2 + 3 C) shared, biases only with cfg.bias.
  static double projection_parameters(const ModelConfig& cfg, Projection p = Projection::qkv);

  using Attention::forward;  // forward(x, memory, rng) stays visible beside the two below
  // x (B, T, C) at positions 0.., the kind's dropout -> (B, T, C), through inner_attention().
  Var forward(const Var& x, Rng& rng) const override;
  // A KVCache of the last `window` positions (all, for -1).
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const override;
  // x's keys enter the KVCache `state`, rotated once at their positions; inner_attention() of x's
  // queries over the cached keys -> (B, T, C).
  Var forward(const Var& x, InferenceState& state) const override;

  int64_t n_embd, n_head;
  float dropout_p;  // the kind's attention-weight dropout, and the output's
  std::shared_ptr<Linear> qkv, proj;
  std::shared_ptr<Dropout> resid_drop;

  // What a wrapper that reads inside the attention needs (the Memorizing
  // Transformer's external memory, layers/memory/memorizing.h): the kind's
  // attention of x (B, T, C) over its segment memory rows (B, M, C; none
  // when undefined or empty) before the output projection, y (B, T, C), and
  // the projection of x it read (B, T, 3C; heads_of splits it). Kinds
  // without it refuse.
  struct Attended {
    Var y;
    Var projected;
  };
  virtual Attended attend_with_heads(const Var& x, const Var& memory, Rng& rng) const;
  // The heads q, k, v (B, H, T, D) of a projection qkv(x) (shared-QK: k is q).
  std::vector<Var> heads_of(const Var& projected) const;
  // y (B, T, C) -> drop(y W_o + b_o): the output projection of merged heads.
  Var project(const Var& y, Rng& rng) const { return resid_drop->forward(proj->forward(y), rng); }

 protected:
  // Registers qkv, proj and resid_drop (in that order).
  void init_projections(bool bias, float proj_init_std, Rng& rng, Projection p = Projection::qkv);
  // q, k, v of x (B, T, C), each (B, H, T, D); shared-QK: k is q.
  std::vector<Var> heads(const Var& x) const { return heads_of(qkv->forward(x)); }
  // y (B, H, T, D) -> drop(merge_heads(y) W_o + b_o), (B, T, C).
  Var output(const Var& y, Rng& rng) const;
  // The same without dropout (inference).
  Var output(const Var& y) const;
  // The dropout probability of this call: dropout_p in training, 0 in eval.
  float live_dropout() const { return is_training() ? dropout_p : 0.0f; }
  // Refuses the inference forward outside NoGradGuard + eval or with x not (B, T, n_embd).
  void check_inference(const Var& x) const { Attention::check_inference(who_, x, n_embd); }
  // The kind's inner attention for the forwards above: q (B, H, Tq, D) at
  // positions q0.., k and v (B, H, Tk, D) at k0.. (q and k rotated), dropout
  // p with rng (null when p is 0) -> (B, H, Tq, D). Refuses unless overridden.
  virtual Var inner_attention(const Var& q, const Var& k, const Var& v, int64_t q0, int64_t k0, float p,
                              Rng* rng) const;
  const char* who_;  // the kind's class, for errors

 private:
  Projection projection_ = Projection::qkv;
};

}  // namespace tapeformer
