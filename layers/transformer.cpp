#include "layers/transformer.h"

#include <cmath>

#include "core/error.h"

namespace tapeformer {

FeedForward::FeedForward(int64_t n_embd, int64_t hidden, bool bias, float dropout, Activation act,
                         float proj_init_std, Rng& rng)
    : activation(act) {
  fc = register_module("fc", std::make_shared<Linear>(n_embd, hidden, bias, rng));
  proj = register_module("proj", std::make_shared<Linear>(hidden, n_embd, bias, rng, proj_init_std));
  drop = register_module("drop", std::make_shared<Dropout>(dropout));
}

Var FeedForward::forward(const Var& x, Rng& rng) const {
  // proj(act(fc(x))) as one fused op (see feed_forward in autograd/ops.h).
  return drop->forward(feed_forward(x, fc->weight, fc->bias, proj->weight, proj->bias, activation), rng);  // (B, T, C)
}

TransformerBlock::TransformerBlock(const ModelConfig& cfg, const Positional& positional, Rng& rng) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  std::shared_ptr<PositionalLayer> pos = positional.make_layer(rng);
  attn = register_module("attn", attention_kinds().get(cfg.attention).make(cfg, std::move(pos), rng));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  mlp = register_module("mlp", std::make_shared<FeedForward>(cfg.n_embd, 4 * cfg.n_embd, cfg.bias,
                                                             cfg.dropout, cfg.activation,
                                                             residual_init_std(cfg), rng));
}

Var TransformerBlock::forward(const Var& x_in, Rng& rng) const {
  Var x = add(x_in, attn->forward(ln_1->forward(x_in), rng));
  return add(x, mlp->forward(ln_2->forward(x), rng));
}

std::unique_ptr<InferenceState> TransformerBlock::make_state(int64_t batch, int64_t window) const {
  return attn->make_state(batch, window);
}

Var TransformerBlock::forward(const Var& x_in, InferenceState& state) const {
  Var x = add(x_in, attn->forward(ln_1->forward(x_in), state));
  Rng unused(0);  // eval mode: no dropout draws
  return add(x, mlp->forward(ln_2->forward(x), unused));
}

TransformerLM::TransformerLM(const ModelConfig& cfg, Rng& rng) : cfg_(cfg) {
  cfg.validate();
  tok_emb = register_module("tok_emb", std::make_shared<Embedding>(cfg.vocab_size, cfg.n_embd, rng));
  pos_emb = register_module("pos_emb", positional_kinds().get(cfg.positional).make(cfg, rng));
  drop = register_module("drop", std::make_shared<Dropout>(cfg.dropout));
  for (int64_t i = 0; i < cfg.n_layer; ++i)
    blocks.push_back(register_module(std::to_string(i), std::make_shared<TransformerBlock>(cfg, *pos_emb, rng)));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  if (!cfg.tie_weights)
    lm_head = register_module("lm_head", std::make_shared<Linear>(cfg.n_embd, cfg.vocab_size, false, rng));
}

ModelFootprint TransformerLM::footprint(const ModelConfig& cfg) {
  cfg.validate_kinds();
  const AttentionKind& attn = attention_kinds().get(cfg.attention);
  const PositionalKind& pos = positional_kinds().get(cfg.positional);
  const double C = static_cast<double>(cfg.n_embd), V = static_cast<double>(cfg.vocab_size), b = cfg.bias ? 1 : 0;
  const double norm = C + b * C;                   // a LayerNorm's gain and bias
  const double mlp = 8 * C * C + b * (4 * C + C);  // fc [C, 4C] and proj [4C, C]
  ModelFootprint f;
  f.parameters = V * C + pos.parameters(cfg) +
                 static_cast<double>(cfg.n_layer) * (2 * norm + attn.parameters(cfg) + mlp) + norm +
                 (cfg.tie_weights ? 0 : C * V);
  const double T = static_cast<double>(cfg.block_size);
  // Per layer the block's (T, C) tensors (about four kept) and the attention's
  // own; the logits and their gradient.
  f.activation_floats = static_cast<double>(cfg.n_layer) * (4.0 * T * static_cast<double>(C) +
                                                            attn.activation_floats(cfg, cfg.block_size)) +
                        2.0 * T * static_cast<double>(V);
  return f;
}

Var TransformerLM::embed(const IndexTensor& ids, int64_t start) const {
  return pos_emb->embed(tok_emb->forward(ids), start);  // (B, T, C)
}

Var TransformerLM::head(const Var& x) const {
  const Var h = ln_f->forward(x);
  if (lm_head) return lm_head->forward(h);              // (B, T, V)
  return matmul(h, transpose(tok_emb->weight, 0, 1));  // tied: h E^T, (B, T, V)
}

Var TransformerLM::forward(const IndexTensor& ids, Rng& rng) const {
  TAPEFORMER_CHECK(ids.shape.rank() == 2, "TransformerLM: ids must be (B, T), got ", ids.shape);
  const int64_t T = ids.shape[1], limit = max_positions();
  TAPEFORMER_CHECK(T >= 1, "TransformerLM: empty sequence (ids ", ids.shape, ")");
  TAPEFORMER_CHECK(limit < 0 || T <= limit, "TransformerLM: sequence length ", T, " exceeds the ", limit,
                   " positions of model.positional \"", cfg_.positional,
                   "\" (model.block_size); a positional scheme without a table takes any length");
  Var x = drop->forward(embed(ids, 0), rng);
  for (const auto& block : blocks) x = block->forward(x, rng);
  return head(x);
}

namespace {
// The model's state: its blocks' states, in order, and the positions seen.
class LMState : public InferenceState {
 public:
  std::string name() const override { return "TransformerLM state"; }
  int64_t length() const override { return length_; }
  void reset() override {
    for (auto& s : blocks) s->reset();
    length_ = 0;
  }
  const TransformerLM* owner = nullptr;  // the model that made it
  std::vector<std::unique_ptr<InferenceState>> blocks;
  int64_t batch = 0, length_ = 0;
};
}  // namespace

std::unique_ptr<InferenceState> TransformerLM::make_state(int64_t batch, int64_t window) const {
  TAPEFORMER_CHECK(batch >= 1, "TransformerLM: batch size must be >= 1, got ", batch);
  TAPEFORMER_CHECK(window >= -1, "TransformerLM: window must be >= 1, 0 (block_size) or -1 (all), got ", window);
  auto state = std::make_unique<LMState>();
  state->owner = this;
  state->batch = batch;
  for (const auto& block : blocks)
    state->blocks.push_back(block->make_state(batch, window == 0 ? cfg_.block_size : window));
  return state;
}

Var TransformerLM::forward(const IndexTensor& ids, InferenceState& state) const {
  LMState& s = state_as<LMState>(state, "TransformerLM", "TransformerLM state");
  TAPEFORMER_CHECK(s.owner == this, "TransformerLM: this inference state was made by another model");
  TAPEFORMER_CHECK(ids.shape.rank() == 2 && ids.shape[0] == s.batch && ids.shape[1] >= 1, "TransformerLM: ids ",
                   ids.shape, " must be (", s.batch, ", T) with T >= 1 for this state");
  const int64_t T = ids.shape[1], limit = max_positions();
  TAPEFORMER_CHECK(limit < 0 || s.length_ + T <= limit, "TransformerLM: ", s.length_, " positions seen + ", T,
                   " new exceed the ", limit, " positions of model.positional \"", cfg_.positional,
                   "\" (reset the state and feed the last ", limit, " tokens)");
  try {
    Var x = embed(ids, s.length_);  // positions continue after the M seen, (B, T, C)
    for (size_t i = 0; i < blocks.size(); ++i) x = blocks[i]->forward(x, *s.blocks[i]);
    s.length_ += T;
    return head(x);  // (B, T, V)
  } catch (...) {
    s.reset();  // some caches may have grown: start over rather than misalign
    throw;
  }
}

}  // namespace tapeformer
