// Values rebuilt instead of kept: cheap outputs dropped after the forward
// that made them and computed again, bit for bit, where the backward reads
// them.
//
//   Var y = release_rebuildable([&] { return block->forward(x, rng); });
//
// An op whose output is cheap to compute again from what its own backward
// keeps anyway marks it rebuildable: LayerNorm's y = gamma * (x - mean) *
// rstd + beta comes back from x, mean and rstd in one elementwise pass. Its
// consumers would otherwise keep y for their own backward (a projection's
// dW = y^T g), C floats per position that nobody else needs.
//
// Inside release_rebuildable(fn), the rebuildable outputs fn makes are
// released when fn returns, all but fn's result: the buffer goes unless
// something else still holds it, the shape stays. A consumer that knows
// (linear, feed_forward) keeps the Var, not its value, and rebuilds the value
// in its backward for that one use (Var::value_once). Any other reader gets
// it rebuilt by Var::value() and kept from then on. The rebuild runs the
// forward's arithmetic on the same numbers, so what follows sees the same
// bits. A block stack runs each layer's forward through this (sequential.h).
#pragma once

#include <functional>

#include "tapeformer/autograd/var.h"

namespace tapeformer {

// fn(), the rebuildable outputs it made released (fn's result kept).
Var release_rebuildable(const std::function<Var()>& fn);

// True while release_rebuildable runs on this thread and a gradient is
// recorded: the only time a mark is worth making.
bool releasing();
// Marks out's value as rebuilt by `rebuild` (which must give the same bits
// from what it captures, none of it changed in place later); registers it
// with the innermost release_rebuildable. Does nothing when !releasing() or
// out records no gradient.
void mark_rebuildable(const Var& out, std::function<Tensor()> rebuild);

}  // namespace tapeformer
