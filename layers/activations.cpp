#include "tapeformer/layers/activations.h"

namespace tapeformer {

Registry<ActivationKind>& activation_kinds() {
  static Registry<ActivationKind> kinds(
      "model.activation",
      {{"gelu", "GELU, tanh form (GPT-2's)", Activation::Gelu, [](const Var& x) { return gelu(x); }},
       {"relu", "max(x, 0)", Activation::Relu, [](const Var& x) { return relu(x); }},
       {"silu", "x sigmoid(x) (swish)", Activation::Silu, [](const Var& x) { return silu(x); }}});
  return kinds;
}

}  // namespace tapeformer
