// "learned": a table of block_size learned position vectors added to the
// token embeddings (GPT-2 / nanoGPT), N(0, 0.02) at init.
#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/basic.h"
#include "tapeformer/layers/positional/positional.h"

namespace tapeformer {
namespace {

class LearnedPositional : public Positional {
 public:
  LearnedPositional(int64_t positions, int64_t n_embd, Rng& rng) : positions_(positions) {
    Tensor w = Tensor::empty({positions, n_embd});  // (block_size, C)
    rng.fill_normal(w, 0.0f, kInitStd);
    weight = register_parameter("weight", w);
  }

  Var embed(const Var& x, int64_t start) const override {
    const int64_t T = x.dim(1);
    TAPEFORMER_CHECK(start >= 0 && start + T <= positions_, "learned positions: positions ", start, "..",
                     start + T - 1, " are beyond the table of ", positions_,
                     " (model.block_size); a positional scheme without a table has no limit");
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) ids[static_cast<size_t>(t)] = static_cast<int32_t>(start + t);
    return add(x, embedding(weight, IndexTensor({1, T}, ids)));  // (B, T, C)
  }
  int64_t max_positions() const override { return positions_; }

  Var weight;  // (block_size, C)

 private:
  int64_t positions_;
};

}  // namespace

PositionalKind learned_positional_kind() {
  PositionalKind kind;
  kind.name = "learned";
  kind.summary = "a learned vector per absolute position, added to the token embeddings (at most block_size; any attention)";
  kind.make = [](const ModelConfig& cfg, Rng& rng) {
    return std::make_shared<LearnedPositional>(cfg.block_size, cfg.n_embd, rng);
  };
  kind.parameters = [](const ModelConfig& cfg) { return static_cast<double>(cfg.block_size) * static_cast<double>(cfg.n_embd); };
  kind.check = [](const ModelConfig&) {};
  return kind;
}

}  // namespace tapeformer
