// The feed-forward activations a config names (`model.activation`), one table.
//
//   activation_kinds().add({"squared_relu", "relu(x)^2", std::nullopt,
//                           [](const Var& x) { const Var r = relu(x); return mul(r, r); }});
//   cfg.activation = "squared_relu";   // the standard MLP of every layer uses it (layers/mlp.h)
//
// A kind with a `fused` counterpart runs inside the fused feed_forward op
// (one GEMM epilogue, autograd/ops.h); the others compose `apply` from ops
// between the two Linear layers (the same math, more memory).
// Kinds: the table in activations.cpp (`tapeformer kinds` lists them).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/registry.h"

namespace tapeformer {

struct ActivationKind {
  std::string name;
  std::string summary;              // one line, for docs
  std::optional<Activation> fused;  // the fused op's activation, when it has one
  std::function<Var(const Var&)> apply;
};

Registry<ActivationKind>& activation_kinds();

}  // namespace tapeformer
