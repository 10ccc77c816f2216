// The tape: an explicit, ordered list of backward closures (a Wengert list).
//
// Every differentiable op, when recording is on and an input requires grad,
// appends one closure holding exactly what its backward needs. backward()
// runs the closures in reverse order, then clears the tape, which frees the
// saved tensors.
//
//   Var loss = cross_entropy(model(x), y);
//   backward(loss);                    // d loss = 1, runs and clears the tape
//
//   { NoGradGuard no_grad; ... }        // nothing recorded (eval, sampling)
//
//   { TapeScope local;                  // a fresh tape for a sub-computation,
//     Var out = f(x);                   // e.g. recomputation inside a custom
//     backward(out, dout); }            // backward (reversible blocks)
//
// Tapes are per thread. Ops run inside a backward pass record nothing unless a
// TapeScope turns recording back on for its own local tape.
#pragma once

#include <functional>
#include <vector>

#include "tapeformer/autograd/var.h"

namespace tapeformer {

class Tape {
 public:
  using Entry = std::function<void()>;

  void record(Entry entry) { entries_.push_back(std::move(entry)); }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  // Drops every entry (and so every saved tensor) without running it.
  void clear() { entries_.clear(); }
  // Runs every entry in reverse order with recording off, releasing each
  // entry's saved tensors as soon as it has run; leaves the tape empty.
  void run_backward();

 private:
  std::vector<Entry> entries_;
};

// The tape ops record on in this thread (the innermost TapeScope's, or the
// thread's default tape).
Tape& current_tape();
// True when ops should record (no NoGradGuard active, not inside backward).
bool grad_enabled();

// Turns recording off for its lifetime.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Makes a fresh tape current, with recording on, for its lifetime.
class TapeScope {
 public:
  TapeScope();
  ~TapeScope();
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;
  Tape& tape() { return tape_; }

 private:
  Tape tape_;
  Tape* previous_tape_;
  bool previous_enabled_;
};

// Seeds d loss = 1 and runs the current tape backward. loss must hold one
// element; otherwise pass a seed gradient of the output's shape. The whole
// tape runs and is cleared: to differentiate two computations separately,
// record each under its own TapeScope (or add their losses).
void backward(const Var& loss);
void backward(const Var& output, const Tensor& seed);
// Several outputs at once (e.g. a block's two streams in a custom backward).
void backward(const std::vector<Var>& outputs, const std::vector<Tensor>& seeds);

// The one gradient accumulator: adds g into v.grad (allocating it on first
// use) when v requires grad. Throws Error naming `op` and both shapes when
// g's shape differs from v's.
void accumulate_grad(const Var& v, const Tensor& g, const char* op);

// Result handle for an op: requires grad iff recording is on and any input does.
Var make_result(Tensor value, std::initializer_list<const Var*> inputs);

// Records `backward(dout)` for `out` when out requires grad. The closure runs
// only if out received a gradient. dout is a second handle on out's gradient,
// so accumulate_grad sees the buffer as shared and copies it instead of
// adopting it: out.grad() stays out's gradient after backward.
template <class F>
void record_backward(const Var& out, F&& backward) {
  if (!out.requires_grad()) return;
  current_tape().record([out, backward = std::forward<F>(backward)]() {
    if (!out.has_grad()) return;
    const Tensor dout = out.grad();
    backward(dout);
  });
}

}  // namespace tapeformer
