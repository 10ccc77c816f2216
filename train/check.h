// Conformance checks for any registered kind, a program's own included: what
// the library's test matrix runs on its own kinds, as one call (and the
// `check` subcommand of cli_main).
//
//   attention_kinds().add(my_attention_kind());
//   const KindCheck r = check_kind("model.attention", "mine");
//   if (!r.ok()) std::fputs(r.text().c_str(), stderr);   // names the kind and each failed check
//
// A kind is built into a tiny model (2 layers of width 16, 12 tokens, its
// ModelOption::small values; an attention kind with learned positions, a
// memory kind with Transformer-XL's and the kinds it builds on) and checked
// for:
//   parameters  its entry's count equals the built model's (no formula written twice wrongly);
//   causality   changing the tokens from position t on leaves every output before t unchanged
//               (kinds that are not strictly causal are reported as skipped);
//   generation  reading the sequence token by token through the inference state gives the
//               whole-sequence forward's logits (to 1e-4); a model with memories is read over
//               three segments, in pieces that cross their boundaries, against the training
//               forward with its memories carried (model.positional txl, and learned);
//   resume      6 training steps equal 3, a checkpoint and 3 more, bit for bit;
//   gradient    the kind's own parameters' gradients against finite differences (gradcheck in
//               extrapolate mode, on the model's initial, well-conditioned weights).
// A model kind's extra inputs are its ModelKind::example_inputs. A check that
// does not apply (a bidirectional kind's generation, the resume of a model
// kind whose hooks make its training data) is reported as skipped, with why.
#pragma once

#include <string>
#include <vector>

namespace tapeformer {

struct CheckOutcome {
  std::string check;   // "parameters", "causality", ...
  enum class Result { ok, failed, skipped } result = Result::ok;
  std::string detail;  // what failed, or why it was skipped
};

struct KindCheck {
  std::string family, kind;  // "model.attention", "softcap"
  std::vector<CheckOutcome> outcomes;
  bool ok() const;
  // One line per check: `model.attention "softcap": causality ok`, or FAILED and what failed.
  std::string text() const;
};

// The families check_kind serves: model.attention, model.positional,
// model.block, model.mlp, memory, model.arch.
std::vector<std::string> checked_families();

// Runs the checks on the kind `name` of `family`; Error for an unknown
// family or kind.
KindCheck check_kind(const std::string& family, const std::string& name);

}  // namespace tapeformer
