// InferenceState: what a layer carries from one call to the next when a
// model reads a sequence piece by piece (sampling one token at a time).
//
//   auto state = model.make_state(/*batch=*/1);
//   Var logits = model.forward(prompt_ids, *state);   // (1, t, V); the state now holds t positions
//   logits = model.forward(next_id, *state);          // (1, 1, V), the past is not recomputed
//
// Each layer that needs state defines its own subclass and makes it: the KV
// cache of softmax attention (KVCache, layers/attention/softmax.h), the
// running sums S, z of causal linear attention. A model composes its layers'
// states into one. A model with memories (layers/memory/memory.h) reads as it
// trained instead: whole segments, its memories carried from one to the next
// (segments() is true). States are for inference only: the forward passes
// that take one run under NoGradGuard, in eval mode.
#pragma once

#include <cstdint>
#include <string>

#include "tapeformer/core/error.h"

namespace tapeformer {

class InferenceState {
 public:
  virtual ~InferenceState() = default;
  // For error messages: "KVCache", "TransformerLM state".
  virtual std::string name() const = 0;
  // Positions seen since construction or the last reset().
  virtual int64_t length() const = 0;
  // Forgets every position (the next call starts a new sequence).
  virtual void reset() = 0;
  // Whether it reads the text in segments of the block size, carrying memories
  // from one to the next: it takes any length (no position table fills up),
  // and the earlier text reaches later tokens through its memories, so a
  // reader feeds it everything rather than a last window.
  virtual bool segments() const { return false; }
};

// `state` as the subclass S that layer `who` makes (named `expected`), or an
// Error naming both (a state passed to a layer other than the one that made it).
template <class S>
S& state_as(InferenceState& state, const char* who, const char* expected) {
  S* s = dynamic_cast<S*>(&state);
  TAPEFORMER_CHECK(s != nullptr, who, ": got a ", state.name(), " as its inference state, not a ", expected);
  return *s;
}

}  // namespace tapeformer
