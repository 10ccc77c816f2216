// FeedForward, the pre-LN TransformerBlock, and TransformerLM (a GPT).
//
//   ModelConfig cfg;                     // vocab 65, block 64, 4 layers, 4 heads, width 128
//   cfg.vocab_size = 65;
//   Rng rng(1337);
//   TransformerLM model(cfg, rng);       // GPT-2 init
//   Var logits = model.forward(ids, rng);               // ids (B, T) -> (B, T, V)
//   Var loss = cross_entropy(logits, targets);
//
// Architecture (nanoGPT): x = drop(tok_emb(ids) + pos_emb(0..T-1));
// per block x += attn(ln_1(x)); x += mlp(ln_2(x)); logits = ln_f(x) W_head.
// With tie_weights the head is the token embedding's transpose. Init:
// N(0, 0.02) everywhere, residual projections N(0, 0.02 / sqrt(2 * n_layer)),
// biases 0, norm gains 1.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/attention.h"
#include "layers/basic.h"

namespace tapeformer {

// FFN(x) = drop(act(x W1 + b1) W2 + b2), hidden = 4 C.
class FeedForward : public Module {
 public:
  FeedForward(int64_t n_embd, int64_t hidden, bool bias, float dropout, Activation act,
              float proj_init_std, Rng& rng);
  Var forward(const Var& x, Rng& rng) const;  // (B, T, C) -> (B, T, C)
  Activation activation;
  std::shared_ptr<Linear> fc, proj;
  std::shared_ptr<Dropout> drop;
};

struct ModelConfig {
  int64_t vocab_size = 0;   // tokens; set from the tokenizer when training
  int64_t block_size = 64;  // longest context, in tokens (learned positions)
  int64_t n_layer = 4;      // Transformer blocks
  int64_t n_head = 4;       // attention heads; must divide n_embd
  int64_t n_embd = 128;     // model width
  float dropout = 0.0f;     // on attention weights, residual branches and embeddings
  bool bias = true;         // biases in Linear and LayerNorm layers
  bool tie_weights = true;  // output head shares the token embedding matrix
  Activation activation = Activation::Gelu;  // MLP: "gelu" (tanh form) | "relu"

  // Throws Error naming the first invalid field.
  void validate() const;
};

class TransformerBlock : public Module {
 public:
  TransformerBlock(const ModelConfig& cfg, Rng& rng);
  Var forward(const Var& x, Rng& rng) const;  // (B, T, C) -> (B, T, C)
  // Inference with the attention's KV cache (see MultiHeadAttention).
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t capacity) const;
  Var forward(const Var& x, InferenceState& state) const;  // (B, T, C) -> (B, T, C)
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<MultiHeadAttention> attn;
  std::shared_ptr<FeedForward> mlp;
};

class TransformerLM : public Module {
 public:
  TransformerLM(const ModelConfig& cfg, Rng& rng);
  // ids (B, T) with T <= block_size -> logits (B, T, V).
  Var forward(const IndexTensor& ids, Rng& rng) const;

  // Reading a sequence piece by piece (sampling): make_state(B) holds every
  // block's state, and forward(ids, state) takes the next T positions, ids
  // (B, T) -> logits (B, T, V), equal to the matching rows of forward() on
  // the whole sequence so far (bit for bit from a fresh or reset state, to
  // float rounding after that). Positions are absolute, so state.length() +
  // T must stay within block_size; past that, reset() and feed the last
  // block_size tokens again. Needs NoGradGuard and eval(). A state belongs to
  // the model that made it; after an error it is reset.
  std::unique_ptr<InferenceState> make_state(int64_t batch) const;
  Var forward(const IndexTensor& ids, InferenceState& state) const;
  const ModelConfig& config() const { return cfg_; }

  std::shared_ptr<Embedding> tok_emb, pos_emb;
  std::shared_ptr<Dropout> drop;
  std::vector<std::shared_ptr<TransformerBlock>> blocks;
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> lm_head;  // null when tied

 private:
  Var embed(const IndexTensor& ids, int64_t start) const;  // token + position (start + t), (B, T, C)
  Var head(const Var& x) const;                            // ln_f and the output head, (B, T, V)
  ModelConfig cfg_;
};

}  // namespace tapeformer
