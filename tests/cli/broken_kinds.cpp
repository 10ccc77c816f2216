// Three attention kinds that are each wrong in one way, and the stock command
// line on them (tapeformer::cli_main): `broken_kinds check` must name each
// kind and the check it fails (tests/cli/check_kinds.sh).
//   model.attention "miscounted"  its entry counts one parameter more than the layer has;
//   model.attention "leaky"       bidirectional softmax attention declared strictly causal;
//   model.attention "forgetful"   its inference state keeps nothing: a token sees only itself.
#include <memory>
#include <string>

#include <tapeformer/cli/cli.h>
#include <tapeformer/layers/attention/attention.h>
#include <tapeformer/layers/attention/projected.h>
#include <tapeformer/layers/attention/softmax.h>

using namespace tapeformer;

namespace {

// Softmax attention that reads each new piece alone: no past at all.
class Forgetful : public MultiHeadAttention {
 public:
  using MultiHeadAttention::MultiHeadAttention;
  Var forward(const Var& x, InferenceState& state) const override {
    auto fresh = MultiHeadAttention::make_state(x.dim(0), -1);
    return MultiHeadAttention::forward(x, *fresh);
  }
};

AttentionKind kind(const std::string& name, bool causal, bool forgetful, double extra) {
  AttentionKind k;
  k.name = name;
  k.summary = "a deliberately broken softmax attention (tests/cli/broken_kinds.cpp)";
  k.make = [causal, forgetful](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos,
                               Rng& rng) -> std::shared_ptr<Attention> {
    if (forgetful)
      return std::make_shared<Forgetful>(cfg.n_embd, cfg.n_head, cfg.bias, cfg.dropout, residual_init_std(cfg), rng,
                                         std::move(pos));
    return std::make_shared<MultiHeadAttention>(cfg.n_embd, cfg.n_head, cfg.bias, cfg.dropout,
                                                residual_init_std(cfg), rng, std::move(pos), nullptr, causal);
  };
  k.parameters = [extra](const ModelConfig& cfg) { return ProjectedAttention::projection_parameters(cfg) + extra; };
  k.check = [](const ModelConfig&, const PositionalKind&) {};
  k.causality = Causality::strict;
  return k;
}

}  // namespace

int main(int argc, char** argv) {
  attention_kinds().add(kind("miscounted", true, false, 1));
  attention_kinds().add(kind("leaky", false, false, 0));
  attention_kinds().add(kind("forgetful", true, true, 0));
  return cli_main(argc, argv);
}
