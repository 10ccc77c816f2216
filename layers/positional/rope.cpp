// "rope": rotary position embedding (Su et al. 2021 §3). Each layer
// rotates the pairs (2k, 2k+1) of q and k at position p by p * 10000^(-2k/D),
// so q_m . k_n depends on m - n only. Values are not rotated; nothing is added
// to the embeddings.
#include "tapeformer/autograd/ops.h"
#include "tapeformer/layers/positional/positional.h"

namespace tapeformer {
namespace {

constexpr PositionalNeeds kRopeNeeds{/*rotates_qk=*/true, /*score_bias=*/false, /*relative_terms=*/false};

class RopeLayer : public PositionalLayer {
 public:
  RopeLayer() : PositionalLayer(kRopeNeeds) {}
  Var rotate(const Var& x, int64_t start) const override { return rotary(x, /*axis=*/2, start); }  // (B, H, T, D)
};

class RopePositional : public Positional {
 public:
  std::shared_ptr<PositionalLayer> make_layer(Rng&) const override { return std::make_shared<RopeLayer>(); }
};

}  // namespace

PositionalKind rope_positional_kind() {
  PositionalKind kind;
  kind.name = "rope";
  kind.summary = "RoPE (Su et al. 2021): q and k rotated in every layer (relative, any length); with linear attention the "
                 "numerator is rotated, not the denominator (not with the efficient feature map)";
  kind.needs = kRopeNeeds;
  kind.make = [](const ModelConfig&, Rng&) { return std::make_shared<RopePositional>(); };
  kind.parameters = [](const ModelConfig&) { return 0.0; };
  kind.check = [](const ModelConfig&) {};
  return kind;
}

}  // namespace tapeformer
