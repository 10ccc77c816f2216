// The Compressive Transformer's compressed memory (Rae et al. 2019), the
// memory kind "compressive" (model.cmem_len > 0): the rows that fall out of
// each layer's segment memory ("xl") are pooled model.cmem_ratio = c to one
// into a second memory of at most model.cmem_len rows (group "compressed",
// (B, CM, C) per layer) instead of being dropped, and each layer attends to
// [compressed; memory; segment]. The pooling is "mean" or "max" over c rows,
// or "conv": a learned 1-D convolution (kernel = stride = c) trained by the
// attention-reconstruction loss, an auxiliary loss of the batch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/var.h"
#include "tapeformer/layers/model_config.h"
#include "tapeformer/layers/module.h"

namespace tapeformer {

// How a stack compresses what falls out of its memory (model.cmem_*).
struct MemoryCompression {
  int64_t len = 0;          // model.cmem_len: compressed rows kept per layer (0: off, rows are dropped)
  int64_t ratio = 2;        // model.cmem_ratio, c: memory rows per compressed row
  std::string fn = "mean";  // model.cmem_fn: "mean" or "max" over each c consecutive rows, or "conv" (learned)
  bool learned() const { return len > 0 && fn == "conv"; }
  static MemoryCompression of(const ModelConfig& cfg);  // off when the config's block kind carries no memories
};

// rows (B, n, C) -> (B, n / c, C): each c consecutive rows pooled ("mean" or
// "max"), oldest first; the n mod c oldest rows are dropped.
Tensor compress_rows(const Tensor& rows, const MemoryCompression& c);

// The learned compression (model.cmem_fn "conv"): per layer, a 1-D
// convolution over time with kernel = stride = c, C channels in and out.
// For the k-th group of c rows r_{kc}, ..., r_{kc+c-1} (each (C)):
//
//   y_k = b + sum_{i<c} r_{kc+i} W_i         W_i [C, C], b [C]
//
// computed as one matrix product of the groups laid side by side,
// (B, n/c, cC) x W [cC, C]. It starts as the mean (W_i = I / c, b = 0), so
// an untrained model compresses as "mean" does. Keys "compress.L.weight",
// "compress.L.bias" for layer L.
class ConvCompression : public Module {
 public:
  ConvCompression(int64_t n_layer, int64_t n_embd, int64_t ratio);
  // Layer `layer`'s compression of rows (B, n, C), n a multiple of c -> (B, n / c, C).
  Var forward(size_t layer, const Var& rows) const;
  // Parameters of a stack of `cfg` (0 unless model.cmem_fn is "conv").
  static double parameters(const ModelConfig& cfg);
  // The attention-reconstruction loss of the segment just read, summed over
  // its layers in order (training; undefined otherwise): an auxiliary loss
  // of the batch, which the trainer backpropagates beside the LM loss
  // (Module::auxiliary_loss). Its gradient reaches the compression alone,
  // and the LM loss none of it.
  void set_reconstruction_loss(Var loss) const { reconstruction_ = std::move(loss); }
  void add_reconstruction_loss(const Var& loss) const {
    reconstruction_ = reconstruction_.defined() ? add(reconstruction_, loss) : loss;
  }
  int64_t ratio;
  std::vector<Var> weights, biases;  // [cC, C] and [C] per layer

 protected:
  Var own_auxiliary_loss(bool of_batch) const override { return of_batch ? reconstruction_ : Var(); }

 private:
  mutable Var reconstruction_;
};

// The Compressive Transformer's attention-reconstruction loss of one layer
// (Rae et al. 2019 §3.2): how far attention over the compressed rows is from
// attention over the rows they replace, for the queries of the segment:
//
//   L = mean( (attn(h, old) - attn(h, f(old)))^2 )
//
// attend(rows) is the layer's content attention of h over rows (B, n, C) ->
// (B, T, C) with the layer's weights held fixed; old (B, n, C) are the rows
// that fell out of the memory, compressed (B, n / c, C) = f(old).
Var reconstruction_loss(const std::function<Var(const Var&)>& attend, const Tensor& old, const Var& compressed);

// What a layer attends to before its segment: [compressed; memory] (B, CM + M, C).
Tensor attended_memory(const Tensor& memory, const Tensor& compressed);

// compressed becomes the last len rows of [compressed; rows] (rows (B, n, C)).
void append_compressed(Tensor& compressed, const Tensor& rows, int64_t len);

}  // namespace tapeformer
