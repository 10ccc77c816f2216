#include "tapeformer/layers/block/standard.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "tapeformer/core/error.h"

namespace tapeformer {

TransformerBlock::TransformerBlock(const ModelConfig& cfg, const Positional& positional, Rng& rng) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias, cfg.norm_eps));
  std::shared_ptr<PositionalLayer> pos = positional.make_layer(rng);
  attn = register_module("attn", make_attention(cfg, std::move(pos), rng));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias, cfg.norm_eps));
  mlp = register_module("mlp", make_mlp(cfg, rng));
}

Var attend_normalised(const Attention& attn, const LayerNorm& ln, const Var& x, const Tensor& memory, Rng& rng) {
  // An empty memory goes through the memory forward too: an external memory lent to attn is read there.
  if (!memory.defined() || memory.dim(1) == 0) return attn.forward(ln.forward(x), Var(), rng);
  return attn.forward(ln.forward(x), ln.forward(Var(memory)), rng);
}

Var TransformerBlock::forward(const Var& x_in, Rng& rng) const { return forward(x_in, Tensor(), rng); }

Var TransformerBlock::forward(const Var& x_in, const Tensor& memory, Rng& rng) const {
  const Var x = add(x_in, attention_branch(x_in, memory, rng));
  return add(x, ff_branch(x, rng));
}

std::unique_ptr<InferenceState> TransformerBlock::make_state(int64_t batch, int64_t window) const {
  return attn->make_state(batch, window);
}

Var TransformerBlock::forward(const Var& x_in, InferenceState& state) const {
  const Var x = add(x_in, attention_branch(x_in, state));
  Rng unused(0);  // eval mode: no dropout draws
  return add(x, ff_branch(x, unused));
}

// LayerNorm's row sums run in packets from the row's first entry, wherever
// the row sits in memory: the gathered rows get their bits of the whole.
Var norm_rows(const LayerNorm& ln, const Var& x, const std::vector<int64_t>& rows) {
  return ln.forward(pick_rows(x, rows));
}

Var TransformerBlock::forward_rows(const Var& x_in, InferenceState& state, const std::vector<int64_t>& rows) const {
  TAPEFORMER_CHECK(x_in.rank() == 3, "TransformerBlock::forward_rows: x must be (B, T, C), got ", x_in.shape());
  const int64_t B = x_in.dim(0), T = x_in.dim(1), C = x_in.dim(2);
  check_rows(rows, B * T, "TransformerBlock::forward_rows");
  if (rows.size() == static_cast<size_t>(B * T)) return forward(x_in, state);  // every row
  const Var a = attn->forward_rows(ln_1->forward(x_in), state, rows);  // (1, R, C)
  if (rows.empty()) return x_in;
  Tensor out = x_in.value().clone();  // (B, T, C): the rows replaced, first by x + F(x)
  const auto scatter = [&](const Tensor& picked) {  // (1, R, C) into out's rows
    const Tensor p = picked.contiguous();
    for (size_t r = 0; r < rows.size(); ++r)
      std::copy_n(p.data() + static_cast<int64_t>(r) * C, C, out.data() + rows[r] * C);
  };
  const Tensor x = add(pick_rows(x_in, rows), a).value();  // (1, R, C)
  scatter(x);
  const Var normed = norm_rows(*ln_2, Var(out), rows);  // (1, R, C)
  Rng unused(0);  // eval mode: no dropout draws
  scatter(add(Var(x), mlp->forward(normed, unused)).value());
  return Var(out);
}

double transformer_block_parameters(const ModelConfig& cfg) {
  const double C = static_cast<double>(cfg.n_embd), b = cfg.bias ? 1 : 0;
  const double norm = C + b * C;                   // a LayerNorm's gain and bias
  return 2 * norm + attention_kinds().get(cfg.attention).parameters(cfg) + mlp_kinds().get(cfg.mlp).parameters(cfg);
}

double transformer_stack_parameters(const ModelConfig& cfg) {
  return static_cast<double>(cfg.n_layer) * transformer_block_parameters(cfg) + memory_parameters(cfg);
}

BlockKind standard_block_kind() {
  BlockKind kind;
  kind.name = "standard";
  kind.summary = "pre-LN residual blocks x += attn(ln_1(x)); x += mlp(ln_2(x)) (GPT-2, nanoGPT), every activation kept for "
                 "the backward";
  kind.make = [](const ModelConfig& cfg, const Positional& positional, Rng& rng) {
    return std::make_shared<StandardStack>(cfg, positional, rng);
  };
  kind.parameters = transformer_stack_parameters;
  kind.check = [](const ModelConfig&) {};
  kind.memory = true;
  return kind;
}

}  // namespace tapeformer
