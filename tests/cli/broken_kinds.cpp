// Attention and memory kinds that are each wrong in one way, one that is
// right, and the stock command line on them (tapeformer::cli_main):
// `broken_kinds check` must name each kind and the check it fails
// (tests/cli/check_kinds.sh).
//   model.attention "miscounted"  its entry counts one parameter more than the layer has;
//   model.attention "leaky"       bidirectional softmax attention declared strictly causal;
//   model.attention "forgetful"   its inference state keeps nothing: a token sees only itself;
//   memory "pooled"               the previous segment's inputs mean-pooled into one more row
//                                 each layer attends to (right);
//   memory "pooled_when_training" the same, but it moves on only when a gradient is recorded, so
//                                 sampling (which records none) reads with it empty;
//   memory "pooled_miscounted"    the same, its entry counting 4 parameters it does not have.
#include <memory>
#include <string>
#include <vector>

#include <tapeformer/cli/cli.h>
#include <tapeformer/layers/attention/attention.h>
#include <tapeformer/layers/attention/projected.h>
#include <tapeformer/layers/attention/softmax.h>
#include <tapeformer/layers/memory/memory.h>

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

// Each layer also attends to the mean of its inputs over the previous segment, (B, 1, C).
class Pooled : public Memory {
 public:
  Pooled(std::string group, bool only_with_gradient) : group_(std::move(group)), only_with_gradient_(only_with_gradient) {}
  void begin_segment(SegmentMemory& state, size_t layers) const override { state.group(group_).resize(layers); }
  Tensor attended(SegmentMemory& state, size_t layer, const Tensor& rows) const override {
    const Tensor& pooled = state.group(group_)[layer];
    if (!pooled.defined()) return rows;
    if (!rows.defined() || rows.dim(1) == 0) return pooled;
    return concat({Var(rows), Var(pooled)}, 1).value();  // (B, n + 1, C)
  }
  void update(SegmentMemory& state, const MemoryLayer& layer, int64_t keep, MemoryCarry&) const override {
    if (only_with_gradient_ && !grad_enabled()) return;
    state.group(group_)[layer.index] = mean(detach(slice(layer.input, 1, 0, keep)), {1}, true).value();  // (B, 1, C)
  }

 private:
  std::string group_;
  bool only_with_gradient_;
};

MemoryKind pooled(const std::string& name, bool only_with_gradient, double extra) {
  MemoryKind k;
  k.name = name;
  k.summary = "the previous segment mean-pooled (tests/cli/broken_kinds.cpp)";
  k.options = {{name + "_len", int64_t{0}, "1: on (0: off)", OptionValue{int64_t{1}}}};
  k.needs = {"xl"};
  k.make = [name, only_with_gradient](const ModelConfig&, const MemoryHost&) -> std::shared_ptr<Memory> {
    return std::make_shared<Pooled>(name, only_with_gradient);
  };
  k.use = [name](const ModelConfig& cfg, bool on, MemoryUse& use) {
    if (on) use.groups.push_back({name, cfg.n_layer, 1, cfg.n_embd, "pooled memory"});
  };
  if (extra > 0) k.parameters = [extra](const ModelConfig&) { return extra; };
  return k;
}

}  // namespace

int main(int argc, char** argv) {
  attention_kinds().add(kind("miscounted", true, false, 1));
  attention_kinds().add(kind("leaky", false, false, 0));
  attention_kinds().add(kind("forgetful", true, true, 0));
  memory_kinds().add(pooled("pooled", false, 0));
  memory_kinds().add(pooled("pooled_when_training", true, 0));
  memory_kinds().add(pooled("pooled_miscounted", false, 4));
  return cli_main(argc, argv);
}
