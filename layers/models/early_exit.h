// Depth-adaptive early exit (Elbayad et al. 2020) with CALM's confidence
// measures and state copying (Schuster et al. 2022): the model kind
// "early_exit", a GPT (TransformerLM, standard blocks) with an output head
// after every layer.
//
//   training:   loss = sum_n w_n CE(head_n(h^n), y),   n = 1..L = model.n_layer
//               w_n = n / sum_j j ("linear", CALM) or 1 / L ("uniform")
//               head_n = the final head (ln_f, lm_head) for every n ("shared"),
//               or a LayerNorm and a C x V projection of its own ("per_layer")
//   inference:  a position leaves after the first layer n < L whose confidence
//               c_n >= lambda (the buffer exit_threshold), its logits head_n(h^n):
//                 "max":    the largest softmax probability of head_n(h^n)
//                 "margin": the largest minus the second largest
//                 "cosine": cos(h^n, h^{n-1}), hidden-state saturation (h^0: the embeddings)
//               A position that left keeps h^n in every later layer: its keys
//               and values there are computed from h^n (CALM's state copying),
//               so later positions attend to it as to any other. Reading piece
//               by piece (sampling), those layers compute only these keys and
//               values for it, not its attention output or MLP, nor its exit
//               heads (set_full_depth(true): every layer for every position,
//               the same numbers).
//
// The training loss reaches the model as the final head's CE (what the
// trainer computes and logs) plus the auxiliary loss of the batch
//   sum_{n<L} w_n CE^n - (1 - w_L) CE^L,
// which needs the batch's targets (ModelContext::targets). With lambda > 1
// (the default, 2) no position ever leaves and the model is a TransformerLM
// bit for bit; `tapeformer calibrate` sets lambda and the measure
// (exit_measure: 0 max, 1 margin, 2 cosine) in the checkpoint. Evaluation
// forwards with exits count the layer each position left at (layer_metrics:
// "exit_layers_mean", "exit_share" per layer, since the model was built or
// reset_exit_counts()).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/layers/adaptive_depth.h"
#include "tapeformer/layers/block/standard.h"
#include "tapeformer/layers/transformer.h"

namespace tapeformer {

class EarlyExitLM : public TransformerLM, public AdaptiveDepth {
 public:
  enum class Confidence { max = 0, margin = 1, cosine = 2 };
  static Confidence parse_confidence(const std::string& name);  // Error naming the three
  static const char* confidence_name(Confidence c);

  EarlyExitLM(const ModelConfig& cfg, Rng& rng);
  Var forward(const IndexTensor& ids, const ModelContext& ctx) const override;
  using LanguageModel::forward;
  using LanguageModel::set_full_depth;  // the whole model's (AdaptiveDepth's is this one's part)
  using AdaptiveDepth::full_depth;
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window = 0) const override;
  static ModelFootprint footprint(const ModelConfig& cfg);

  // head_n(h), n = 1..L: (B, T, C) -> (B, T, V).
  Var exit_logits(const Var& h, int64_t n) const;
  // The same for the rows `rows` of h only (flat b * T + t, ascending), each
  // exit_logits(h, n)'s row bit for bit: (B, T, C) -> (1, R, V).
  Var exit_logits(const Var& h, int64_t n, const std::vector<int64_t>& rows) const;
  // Confidence of each position, (B, T) values, from layer n's logits (B, T, V;
  // the cosine measure does not read them: may be undefined), its state h
  // (B, T, C) and the state before it.
  Tensor confidence(const Tensor& logits, const Tensor& h, const Tensor& before) const;
  double threshold() const;
  void set_threshold(double lambda);  // lambda > 1: never
  Confidence measure() const;
  void set_measure(Confidence c);
  // The weights w_1..w_L of the layers' losses.
  std::vector<double> loss_weights() const;

  // Exits counted by evaluation forwards: positions per exit layer 1..L.
  // Evaluation may run forwards on several threads at once (DataParallel::losses):
  // what they count is kept under a lock.
  std::vector<int64_t> exit_counts() const;
  void reset_exit_counts() const;
  // The exit layer of each position in the last forward, (B, T) ids 1..L; empty after a forward without exits.
  IndexTensor last_exit_layers() const;

  std::shared_ptr<StandardStack> blocks;                 // the stack, as its layers
  std::vector<std::shared_ptr<LayerNorm>> exit_norms;    // per_layer: "exit.N.ln", N = 1..L-1
  std::vector<std::shared_ptr<Linear>> exit_heads;       // per_layer: "exit.N.head"

 protected:
  Var own_auxiliary_loss(bool of_batch) const override { return of_batch ? exit_loss_ : Var(); }
  std::vector<std::pair<std::string, std::vector<double>>> own_metrics() const override;

 private:
  // The layers over x (B, T, C) of positions start..: `layer(i, h)` runs block i.
  Var run_layers(const Var& x, const ModelContext& ctx, const std::function<Var(size_t, const Var&)>& layer) const;
  // The same with exits on, reading piece by piece: the layers after a
  // position's exit only take its keys and values into `layers`.
  Var run_skipping(const Var& x, LayerStates& layers) const;
  Tensor threshold_, measure_;             // buffers "exit_threshold", "exit_measure", (1)
  std::vector<double> weights_;            // w_1..w_L
  // What a forward leaves, under mutex_ (evaluation may run forwards on
  // several threads at once): the exits counted; drop_loss: the auxiliary
  // loss of the last forward let go (a training forward then sets its own).
  void counted(const IndexTensor& exits, bool drop_loss = false) const;
  mutable Var exit_loss_;                  // the auxiliary loss of the last training forward
  mutable std::mutex mutex_;               // exit_loss_ (dropped), counts_, last_exits_
  mutable std::vector<int64_t> counts_;    // per exit layer
  mutable IndexTensor last_exits_;
};

}  // namespace tapeformer
