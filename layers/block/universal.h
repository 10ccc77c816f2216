// The Universal Transformer (Dehghani et al. 2019): one block applied
// recurrently in depth with shared weights, the positions and a timestep
// signal added to the state before every step, and, optionally, ACT halting
// per position (Graves 2016), the block kind "universal".
//
//   step n = 1..K (K = model.n_layer):
//     s^n  = h^{n-1} + P + S_n          (B, T, C)   P: the positional scheme's
//                                                   embedding (Positional::embed;
//                                                   in x already for n = 1),
//                                                   S_n: a sinusoid of n - 1
//     p^n  = sigmoid(w_h . s^n + b_h)    (B, T, 1)   the halting unit (ACT)
//     h^n  = block(s^n)                  (B, T, C)   for positions still running;
//                                                   halted ones keep their state
//   ACT:  N = the first n with p^1 + ... + p^n > 1 - eps, or K;
//         R = 1 - (p^1 + ... + p^{N-1});   weights w^n = p^n (n < N), R (n = N)
//         y = sum_n w^n h^n                (B, T, C)   the stack's output
//         ponder cost tau mean(N + R), added to the loss (Module::auxiliary_loss)
//   no ACT: y = h^K.
//
// A halted position keeps h^N, and later steps still add P + S_n to it: the
// positions still running attend to it as to any other key. The block is
// one TransformerBlock registered as "0" (keys "0.attn.qkv.weight", ... as
// the standard stack's first layer), the halting unit "halt".
//
// Reading piece by piece keeps one state of the block per step. A later
// position's step n reads every earlier one's key at step n, so a position
// that halted still enters the states of the steps after its N, with its
// frozen state h^N + P + S_n; the block computes only its keys and values
// there, not its attention output or MLP (set_full_depth(true): the whole
// block, the same numbers).
//
// Reading piece by piece counts each new position's N too, reported as
// "ponder_reading_mean" (the mean steps a sampled position ran, since the
// model was built).
//
// Training forwards count each position's N (a batch statistic, summed over
// every shard); after the optimizer step the stack keeps the step's counts
// as buffers (in the checkpoint) and logs them on evaluation steps:
// "ponder_mean" (mean N), "ponder_hist" (share of positions with N = 1..K),
// "ponder_by_position" (mean N at each position 0..block_size-1).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/layers/adaptive_depth.h"
#include "tapeformer/layers/basic.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/block/standard.h"

namespace tapeformer {

// ACT's halting over the steps of a recurrence, one position per element.
//
//   ActHalting act(/*shape=*/{B, T, 1}, /*epsilon=*/0.01f, /*max_steps=*/K);
//   for (int n = 1; !act.done(); ++n) {
//     Tensor runs = act.running();           // 1 where the position runs step n
//     Var w = act.step(p);                   // p^n (B, T, 1) -> w^n (B, T, 1)
//   }
//   Var cost = act.ponder();                 // N + R, (B, T, 1)
//
// N is decided on the values (the rule is not differentiable); the weights
// and the remainder carry the gradient to the p^n: d(N + R)/dp^n = -1 for n < N.
class ActHalting {
 public:
  ActHalting(const Shape& shape, float epsilon, int64_t max_steps);
  Var step(const Var& p);                       // p^n, (B, T, 1) -> w^n, (B, T, 1)
  const Tensor& running() const { return running_; }  // 1 / 0 per position for the next step, (B, T, 1)
  bool done() const;                            // every position halted
  Var ponder() const;                           // N + R, (B, T, 1)
  const Tensor& steps() const { return steps_; }  // N so far per position, (B, T, 1)
  int64_t taken() const { return n_; }          // steps run

 private:
  float threshold_;   // 1 - epsilon
  int64_t max_steps_;
  int64_t n_ = 0;
  Var sum_;           // p^1 + ... of the steps a position ran without halting, (B, T, 1)
  Var remainder_;     // R of the halted positions, 0 elsewhere, (B, T, 1)
  Tensor running_;    // (B, T, 1)
  Tensor steps_;      // (B, T, 1)
};

class UniversalStack : public BlockStack, public AdaptiveDepth {
 public:
  // `positional` is the model's scheme, kept by reference: it outlives the stack.
  UniversalStack(const ModelConfig& cfg, const Positional& positional, Rng& rng);
  Var forward(const Var& x, Rng& rng) const override;  // (B, T, C) -> (B, T, C)
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const override;
  Var forward(const Var& x, InferenceState& state) const override;  // (B, T, C) -> (B, T, C)

  // S_n: the timestep signal of step n = 1..K, (1, 1, C).
  Tensor timestep(int64_t n) const;
  // What the last forward of this stack measured (eval or training): the
  // mean N over its positions and how many there were (a program's own
  // evaluation, examples/copy_task).
  struct Ponder {
    double steps = 0;      // sum of N
    double remainder = 0;  // sum of R
    int64_t positions = 0;
  };
  Ponder last_ponder() const;

  std::shared_ptr<TransformerBlock> block;  // "0", applied at every step
  std::shared_ptr<Linear> halt;             // "halt", C -> 1 (null without ACT)
  int64_t max_steps;                        // K = model.n_layer
  bool act;
  float epsilon, tau;

 protected:
  bool after_optimizer_step(int64_t step) override;
  Var own_auxiliary_loss(bool of_batch) const override { return of_batch ? ponder_loss_ : Var(); }
  std::vector<std::pair<std::string, std::vector<double>>> own_metrics() const override;

 private:
  // The recurrence over x (B, T, C) at positions start..; `layer(s, n, rows)`
  // runs the block at step n, where only `rows` (flat b * T + t, ascending)
  // are still running and need its output.
  Var recur(const Var& x, int64_t start, bool every_step,
            const std::function<Var(const Var&, int64_t, const std::vector<int64_t>&)>& layer) const;
  const Positional* positional_;
  int64_t block_size_;
  Tensor counts_, by_position_;        // statistics: N histogram (K), [sum of N; positions] per position (2, block_size)
  Tensor last_counts_, last_position_;  // buffers: the last step's
  // What a forward measured, kept under mutex_: evaluation may run forwards
  // on several threads at once (DataParallel::losses); `reading`: piece by piece.
  void record(const Ponder& measured, bool reading) const;
  mutable Var ponder_loss_;             // tau mean(N + R) of the last training forward
  mutable std::mutex mutex_;            // evaluation's: ponder_loss_, last_, reading_steps_, reading_positions_
  mutable Ponder last_;
  mutable double reading_steps_ = 0, reading_positions_ = 0;  // N summed over the positions read piece by piece
};

}  // namespace tapeformer
