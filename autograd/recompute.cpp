#include "tapeformer/autograd/recompute.h"

#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"

namespace tapeformer {
namespace {

thread_local int replays = 0;      // recompute second runs open on this thread
thread_local int first_runs = 0;   // recompute first runs open on this thread (nothing recorded)

struct Count {
  int& n;
  explicit Count(int& counter) : n(counter) { ++n; }
  ~Count() { --n; }
};

}  // namespace

bool recomputing() { return replays > 0; }

bool records_gradient() { return grad_enabled() || (first_runs > 0 && replays == 0); }

std::vector<Var> recompute(RecomputeFn fn, const std::vector<Var>& inputs, Rng& rng) {
  TAPEFORMER_CHECK(fn != nullptr, "recompute: no function given");
  if (!grad_enabled()) return fn(inputs, rng);
  const Rng before = rng;  // what the second run draws from
  std::vector<Var> outputs;
  {
    // Nothing recorded: no op saves a tensor for a backward. The values are
    // those of the recorded run (an op's arithmetic does not depend on
    // recording), which kind_runs checks bit for bit.
    NoGradGuard no_grad;
    Count first_run(first_runs);
    const std::vector<Var> first = fn(inputs, rng);
    for (const Var& y : first) outputs.push_back(y.defined() ? Var(y.value(), true) : Var());
  }
  bool any = false;
  for (const Var& y : outputs) any = any || (y.defined() && y.requires_grad());
  if (!any) return outputs;
  current_tape().record([fn = std::move(fn), inputs, outputs, before]() {
    bool seeded = false;
    for (const Var& y : outputs) seeded = seeded || (y.defined() && y.has_grad());
    if (!seeded) return;
    // The second run reads the inputs themselves, so their gradients
    // accumulate op by op, in the order they would without recompute.
    {
      TapeScope replay;
      Count second_run(replays);
      Rng rng = before;
      const std::vector<Var> again = fn(inputs, rng);
      TAPEFORMER_CHECK(again.size() == outputs.size(), "recompute: the second run gave ", again.size(),
                       " outputs, the first ", outputs.size(), " (fn must not depend on state that changed)");
      std::vector<Var> reached;
      std::vector<Tensor> seeds;
      for (size_t i = 0; i < again.size(); ++i) {
        if (!outputs[i].defined() || !outputs[i].has_grad() || !again[i].requires_grad()) continue;
        reached.push_back(again[i]);
        seeds.push_back(outputs[i].grad());
      }
      if (!reached.empty()) backward(reached, seeds);
    }
  });
  return outputs;
}

std::vector<Var> recompute(const std::function<std::vector<Var>(const std::vector<Var>&)>& fn,
                           const std::vector<Var>& inputs) {
  TAPEFORMER_CHECK(fn != nullptr, "recompute: no function given");
  Rng unused(0);
  return recompute([fn](const std::vector<Var>& in, Rng&) { return fn(in); }, inputs, unused);
}

}  // namespace tapeformer
