#include "tapeformer/layers/basic.h"

#include "tapeformer/core/error.h"

namespace tapeformer {
namespace {
Tensor normal(const Shape& shape, float std, Rng& rng) {
  Tensor t = Tensor::empty(shape);
  rng.fill_normal(t, 0.0f, std);
  return t;
}
}  // namespace

Linear::Linear(int64_t in, int64_t out, bool with_bias, Rng& rng, float init_std) {
  TAPEFORMER_CHECK(in > 0 && out > 0, "Linear: sizes must be positive, got in ", in, ", out ", out);
  weight = register_parameter("weight", normal({in, out}, init_std, rng));
  if (with_bias) bias = register_parameter("bias", Tensor::zeros({out}));
}

Var Linear::forward(const Var& x) const { return linear(x, weight, bias); }

Embedding::Embedding(int64_t num, int64_t dim, Rng& rng, float init_std) {
  TAPEFORMER_CHECK(num > 0 && dim > 0, "Embedding: sizes must be positive, got ", num, " x ", dim);
  weight = register_parameter("weight", normal({num, dim}, init_std, rng));
}

Var Embedding::forward(const IndexTensor& ids) const { return embedding(weight, ids); }

LayerNorm::LayerNorm(int64_t dim, bool with_bias, float eps_) : eps(eps_) {
  TAPEFORMER_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  weight = register_parameter("weight", Tensor::ones({dim}));
  if (with_bias) bias = register_parameter("bias", Tensor::zeros({dim}));
}

Var LayerNorm::forward(const Var& x) const { return layer_norm(x, weight, bias, eps); }

Var LayerNorm::forward_fixed(const Var& x) const {
  return layer_norm(x, detach(weight), bias.defined() ? detach(bias) : Var(), eps);
}

RMSNorm::RMSNorm(int64_t dim, float eps_) : eps(eps_) {
  TAPEFORMER_CHECK(dim > 0, "RMSNorm: dim must be positive, got ", dim);
  weight = register_parameter("weight", Tensor::ones({dim}));
}

Var RMSNorm::forward(const Var& x) const { return rms_norm(x, weight, eps); }

Dropout::Dropout(float p_) : p(p_) {
  TAPEFORMER_CHECK(p >= 0.0f && p < 1.0f, "Dropout: p must be in [0, 1), got ", p);
}

Var Dropout::forward(const Var& x, Rng& rng) const {
  if (!is_training() || p == 0.0f) return x;
  return dropout(x, p, rng);
}

}  // namespace tapeformer
