// "sinusoidal": Vaswani et al.'s fixed table, PE(p, 2k) = sin(p / 10000^(2k/C)),
// PE(p, 2k+1) = cos(p / 10000^(2k/C)), computed for any position. It is added
// with amplitude 0.02 sqrt(2), so each component has the token embeddings'
// init RMS (0.02) — the role Vaswani's sqrt(C)-scaled embeddings of std
// C^-1/2 play against a unit-amplitude table.
#include <cmath>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/layers/basic.h"
#include "tapeformer/layers/positional/positional.h"

namespace tapeformer {
namespace {

class SinusoidalPositional : public Positional {
 public:
  Var embed(const Var& x, int64_t start) const override {
    const int64_t T = x.dim(1), C = x.dim(2);
    const double amplitude = kInitStd * std::sqrt(2.0);
    Tensor pe = Tensor::empty({1, T, C});  // (1, T, C)
    Scalar* out = pe.data();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        // angles in double: positions run into the thousands when sampling
        const double angle = static_cast<double>(start + t) / std::pow(10000.0, static_cast<double>(c / 2 * 2) / C);
        out[t * C + c] = static_cast<Scalar>(amplitude * (c % 2 == 0 ? std::sin(angle) : std::cos(angle)));
      }
    return add(x, Var(pe));  // (B, T, C)
  }
};

}  // namespace

PositionalKind sinusoidal_positional_kind() {
  PositionalKind kind;
  kind.name = "sinusoidal";
  kind.summary = "Vaswani's fixed sin/cos table added to the token embeddings (any length; any attention)";
  kind.make = [](const ModelConfig&, Rng&) { return std::make_shared<SinusoidalPositional>(); };
  kind.parameters = [](const ModelConfig&) { return 0.0; };
  kind.check = [](const ModelConfig&) {};
  return kind;
}

}  // namespace tapeformer
