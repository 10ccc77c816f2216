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

void ModelConfig::validate() const {
  TAPEFORMER_CHECK(vocab_size > 0, "model.vocab_size must be > 0, got ", vocab_size);
  TAPEFORMER_CHECK(block_size > 0, "model.block_size must be > 0, got ", block_size);
  TAPEFORMER_CHECK(n_layer > 0, "model.n_layer must be > 0, got ", n_layer);
  TAPEFORMER_CHECK(n_head > 0, "model.n_head must be > 0, got ", n_head);
  TAPEFORMER_CHECK(n_embd > 0 && n_embd % n_head == 0, "model.n_embd (", n_embd,
                   ") must be a positive multiple of model.n_head (", n_head, ")");
  TAPEFORMER_CHECK(dropout >= 0.0f && dropout < 1.0f, "model.dropout must be in [0, 1), got ", dropout);
}

namespace {
// GPT-2: residual projections are scaled so the residual stream's variance
// does not grow with depth.
float residual_std(const ModelConfig& cfg) {
  return kInitStd / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
}
}  // namespace

TransformerBlock::TransformerBlock(const ModelConfig& cfg, Rng& rng) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  attn = register_module("attn", std::make_shared<MultiHeadAttention>(
                                     cfg.n_embd, cfg.n_head, cfg.bias, cfg.dropout, residual_std(cfg), rng));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  mlp = register_module("mlp", std::make_shared<FeedForward>(cfg.n_embd, 4 * cfg.n_embd, cfg.bias,
                                                             cfg.dropout, cfg.activation,
                                                             residual_std(cfg), rng));
}

Var TransformerBlock::forward(const Var& x_in, Rng& rng) const {
  Var x = add(x_in, attn->forward(ln_1->forward(x_in), rng));
  return add(x, mlp->forward(ln_2->forward(x), rng));
}

std::unique_ptr<InferenceState> TransformerBlock::make_state(int64_t batch, int64_t capacity) const {
  return attn->make_cache(batch, capacity);
}

Var TransformerBlock::forward(const Var& x_in, InferenceState& state) const {
  Var x = add(x_in, attn->forward(ln_1->forward(x_in), state_as<KVCache>(state, "TransformerBlock", "KVCache")));
  Rng unused(0);  // eval mode: no dropout draws
  return add(x, mlp->forward(ln_2->forward(x), unused));
}

TransformerLM::TransformerLM(const ModelConfig& cfg, Rng& rng) : cfg_(cfg) {
  cfg.validate();
  tok_emb = register_module("tok_emb", std::make_shared<Embedding>(cfg.vocab_size, cfg.n_embd, rng));
  pos_emb = register_module("pos_emb", std::make_shared<Embedding>(cfg.block_size, cfg.n_embd, rng));
  drop = register_module("drop", std::make_shared<Dropout>(cfg.dropout));
  for (int64_t i = 0; i < cfg.n_layer; ++i)
    blocks.push_back(register_module(std::to_string(i), std::make_shared<TransformerBlock>(cfg, rng)));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
  if (!cfg.tie_weights)
    lm_head = register_module("lm_head", std::make_shared<Linear>(cfg.n_embd, cfg.vocab_size, false, rng));
}

Var TransformerLM::embed(const IndexTensor& ids, int64_t start) const {
  const int64_t T = ids.shape[1];
  std::vector<int32_t> positions(T);
  for (int64_t t = 0; t < T; ++t) positions[t] = static_cast<int32_t>(start + t);
  return add(tok_emb->forward(ids), pos_emb->forward(IndexTensor({1, T}, positions)));  // (B, T, C)
}

Var TransformerLM::head(const Var& x) const {
  const Var h = ln_f->forward(x);
  if (lm_head) return lm_head->forward(h);              // (B, T, V)
  return matmul(h, transpose(tok_emb->weight, 0, 1));  // tied: h E^T, (B, T, V)
}

Var TransformerLM::forward(const IndexTensor& ids, Rng& rng) const {
  TAPEFORMER_CHECK(ids.shape.rank() == 2, "TransformerLM: ids must be (B, T), got ", ids.shape);
  const int64_t T = ids.shape[1];
  TAPEFORMER_CHECK(T >= 1 && T <= cfg_.block_size, "TransformerLM: sequence length ", T,
                   " exceeds the block size ", cfg_.block_size);
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

std::unique_ptr<InferenceState> TransformerLM::make_state(int64_t batch) const {
  TAPEFORMER_CHECK(batch >= 1, "TransformerLM: batch size must be >= 1, got ", batch);
  auto state = std::make_unique<LMState>();
  state->owner = this;
  state->batch = batch;
  for (const auto& block : blocks) state->blocks.push_back(block->make_state(batch, cfg_.block_size));
  return state;
}

Var TransformerLM::forward(const IndexTensor& ids, InferenceState& state) const {
  LMState& s = state_as<LMState>(state, "TransformerLM", "TransformerLM state");
  TAPEFORMER_CHECK(s.owner == this, "TransformerLM: this inference state was made by another model");
  TAPEFORMER_CHECK(ids.shape.rank() == 2 && ids.shape[0] == s.batch && ids.shape[1] >= 1, "TransformerLM: ids ",
                   ids.shape, " must be (", s.batch, ", T) with T >= 1 for this state");
  const int64_t T = ids.shape[1];
  TAPEFORMER_CHECK(s.length_ + T <= cfg_.block_size, "TransformerLM: ", s.length_, " positions seen + ", T,
                   " new exceed the block size ", cfg_.block_size, " (reset the state and feed the last ",
                   cfg_.block_size, " tokens)");
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
