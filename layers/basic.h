// The basic layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout.
//
//   Rng rng(0);
//   Linear fc(128, 512, /*bias=*/true, rng);   // weight [in, out] ~ N(0, 0.02), bias 0
//   Var y = fc.forward(x);                      // (B, T, 128) -> (B, T, 512)
//
// Initialisation follows GPT-2 / nanoGPT: weights N(0, 0.02), biases 0, norm
// gains 1. Linear stores its weight as [in, out] (y = x W + b, docs/math.md#conventions);
// transpose when comparing with PyTorch's [out, in].
#pragma once

#include "tapeformer/autograd/ops.h"
#include "tapeformer/layers/module.h"

namespace tapeformer {

inline constexpr float kInitStd = 0.02f;

class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias, Rng& rng, float init_std = kInitStd);
  Var forward(const Var& x) const;  // (..., in) -> (..., out)
  Var weight, bias;                 // [in, out], [out] (undefined without bias)
};

class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, Rng& rng, float init_std = kInitStd);
  Var forward(const IndexTensor& ids) const;  // (...) -> (..., dim)
  Var weight;                                 // [num, dim]
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, bool bias = true, float eps = 1e-5f);
  Var forward(const Var& x) const;
  // The same norm with its gain and bias held fixed: no gradient reaches them.
  Var forward_fixed(const Var& x) const;
  Var weight, bias;  // [dim] ones, [dim] zeros (undefined without bias)
  float eps;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, float eps = 1e-5f);
  Var forward(const Var& x) const;
  Var weight;  // [dim] ones
  float eps;
};

// Inverted dropout; identity in eval mode or when p == 0. Masks come from the
// Rng passed to forward, so runs are reproducible.
class Dropout : public Module {
 public:
  explicit Dropout(float p);
  Var forward(const Var& x, Rng& rng) const;
  float p;
};

}  // namespace tapeformer
