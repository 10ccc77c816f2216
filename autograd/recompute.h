// Activation recompute: memory traded for compute, bit for bit.
//
//   std::vector<Var> y = recompute([block](const std::vector<Var>& in, Rng& rng) {
//     return std::vector<Var>{block->forward(in[0], rng)};   // (B, T, C) -> (B, T, C)
//   }, {x}, rng);
//
// fn runs now with nothing recorded, so no op saves a tensor for a backward;
// only the inputs and outputs are kept. In the backward fn runs again on the same
// inputs, with the Rng as the first run found it, on a nested tape, and that
// tape's backward adds to the inputs' and the parameters' gradients op by op,
// in the order the ops would without recompute. Ops are deterministic and do
// not depend on the thread count, so the second run gives the bits of the
// first, and every gradient is the one without recompute, bit for bit.
//
// What fn must do:
//   - own what it reads: it runs again after the caller has returned, so it
//     captures by value (shared_ptr to modules, tensors) everything besides
//     its inputs; a tensor read without gradient (a memory's rows) may be an
//     input too;
//   - draw only from the Rng it is given (dropout): the caller's Rng advances
//     once, as without recompute, and the second run replays the same draws;
//   - do its side effects once: a layer that accumulates a statistic of a
//     training forward asks records_gradient() (not grad_enabled(): the first
//     run records nothing) and skips it when recomputing() is true; a loss a
//     caller reads later is an output of fn, not a member set inside.
// Nested use works (fn may call recompute). Without recording (NoGradGuard,
// eval) recompute is fn, run once.
#pragma once

#include <functional>
#include <vector>

#include "tapeformer/autograd/var.h"
#include "tapeformer/core/rng.h"

namespace tapeformer {

using RecomputeFn = std::function<std::vector<Var>(const std::vector<Var>& inputs, Rng& rng)>;

// fn's outputs for `inputs`, their intermediates recomputed in the backward.
std::vector<Var> recompute(RecomputeFn fn, const std::vector<Var>& inputs, Rng& rng);
// The same for a function that draws nothing.
std::vector<Var> recompute(const std::function<std::vector<Var>(const std::vector<Var>&)>& fn,
                           const std::vector<Var>& inputs);

// True while a recompute's second run (in the backward) is on this thread:
// side effects of a forward (statistics, kept values) are skipped then.
bool recomputing();
// Whether the forward running now is one whose gradient will be taken:
// recording is on (grad_enabled()), or it is a recompute's first run, which
// records nothing because its second run will.
bool records_gradient();

}  // namespace tapeformer
