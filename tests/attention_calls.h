// The attention tests' shorthands for softmax_attention with an AttentionSpec
// (autograd/ops.h): the plain, block-masked, head-grouped and row-positioned
// forms the kinds use, each one spec.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/layers/attention/adaptive_span.h"
#include "tapeformer/layers/attention/lsh.h"

namespace attention_calls {

using namespace tapeformer;

// softmax_attention with constant terms `bias`, causal or not, dropout p.
inline Var attend(const Var& q, const Var& k, const Var& v, std::vector<Tensor> bias = {}, bool causal = true,
                  Scalar p = 0, Rng* rng = nullptr) {
  AttentionSpec spec;
  spec.bias = std::move(bias);
  spec.causal = causal;
  spec.dropout_p = p;
  spec.rng = rng;
  return softmax_attention(q, k, v, spec);
}

// The same over the tiles of a block mask, with a learned bias by distance
// (adaptive span's DistanceTerm) when `distance` is defined.
inline Var attend_blocks(const Var& q, const Var& k, const Var& v, std::shared_ptr<const kernels::BlockMask> blocks,
                         std::vector<Tensor> bias = {}, bool causal = true, Scalar p = 0, Rng* rng = nullptr,
                         const Var& distance = Var()) {
  AttentionSpec spec;
  spec.blocks = std::move(blocks);
  spec.bias = std::move(bias);
  spec.causal = causal;
  spec.dropout_p = p;
  spec.rng = rng;
  if (distance.defined()) spec.terms = {{std::make_shared<DistanceTerm>(distance.value()), distance}};
  return softmax_attention(q, k, v, spec);
}

// Causal attention with heads in groups.
inline Var attend_groups(const Var& q, const Var& k, const Var& v, std::vector<AttentionHeadGroup> groups,
                         std::vector<Tensor> bias = {}, Scalar p = 0, Rng* rng = nullptr) {
  AttentionSpec spec;
  spec.groups = std::move(groups);
  spec.bias = std::move(bias);
  spec.dropout_p = p;
  spec.rng = rng;
  return softmax_attention(q, k, v, spec);
}

// Rows in another order than their positions (LSH's PositionMask), not
// causal: {y, lse}.
inline std::vector<Var> attend_positioned(const Var& q, const Var& k, const Var& v,
                                          std::shared_ptr<const kernels::BlockMask> blocks, const IndexTensor& q_pos,
                                          const IndexTensor& k_pos, bool no_self = false, Scalar p = 0,
                                          Rng* rng = nullptr) {
  AttentionSpec spec;
  spec.causal = false;
  spec.blocks = std::move(blocks);
  spec.masks = {std::make_shared<PositionMask>(q_pos, k_pos, no_self)};
  spec.dropout_p = p;
  spec.rng = rng;
  Var lse;
  const Var y = softmax_attention(q, k, v, spec, &lse);
  return {y, lse};
}

}  // namespace attention_calls
