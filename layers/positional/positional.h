// Positional schemes: how a model knows where each token is (the math:
// docs/math.md#positional-schemes).
//
//   ModelConfig cfg;  cfg.positional = "rope";
//   std::shared_ptr<Positional> pos = positional_kinds().get(cfg.positional).make(cfg, rng);
//   Var x = pos->embed(tok_emb(ids), /*start=*/0);             // (B, T, C); unchanged for rope
//   std::shared_ptr<PositionalLayer> in_layer = pos->make_layer(rng);  // one per attention layer
//   Var q_rot = in_layer->rotate(q, /*start=*/0);                // (B, H, T, D)
//
// A scheme acts in up to four places, and says which through PositionalNeeds
// so that attention kinds can refuse what their math cannot do:
//   - the token embeddings (learned, sinusoidal): Positional::embed;
//   - q and k after the projections (RoPE): PositionalLayer::rotate;
//   - constant additive score terms (ALiBi; txl's same_length mask): PositionalLayer::score_bias;
//   - learned per-(i, j) score and value terms (Shaw; txl's on scores only): score_terms, value_terms.
// Positions are absolute (queries at q0 + i, keys at k0 + j), so a layer
// with a KV cache or a sliding window passes where its rows really are.
//
// Kinds: the table in layers/positional/registry.cpp, one file each beside it
// (`tapeformer kinds` and docs/kinds.md list them with their papers).
// Adding one: see docs/adding-an-attention-kind.md (the same pattern).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/core/registry.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/layers/model_config.h"
#include "tapeformer/layers/module.h"

namespace tapeformer {

// What a scheme asks of an attention kind.
struct PositionalNeeds {
  bool rotates_qk = false;      // q and k rotated by their positions (RoPE)
  bool score_bias = false;      // constant additive terms on the T x T scores (ALiBi)
  bool relative_terms = false;  // learned per-(i, j) terms on scores and values (Shaw)
};

// The part of a scheme that lives inside one attention layer. The defaults
// do nothing; a kind overrides what it needs (and declares it in `needs`).
class PositionalLayer : public Module {
 public:
  explicit PositionalLayer(PositionalNeeds needs = {}) : needs_(needs) {}
  const PositionalNeeds& needs() const { return needs_; }

  // q or k (B, H, T, D) of positions start..start+T-1, rotated (RoPE).
  virtual Var rotate(const Var& x, int64_t start) const { return x; }
  // Constant score terms, each broadcastable to (B, H, Tq, Tk), added to the
  // scaled scores of queries q0.. and keys k0.. (ALiBi).
  virtual std::vector<Tensor> score_bias(int64_t n_head, int64_t Tq, int64_t Tk, int64_t q0, int64_t k0) const {
    return {};
  }
  // Learned score terms (B, H, Tq, Tk) added to q k^T before the 1/sqrt(D)
  // scale, for q (B, H, Tq, D) and k (B, H, Tk, D) (Shaw: q_i . a^K_ij;
  // Transformer-XL: u . k_j + (q_i + v) . W_kR R_{i-j}).
  virtual Var score_terms(const Var& q, const Var& k, int64_t q0, int64_t k0) const { return Var(); }
  // Learned value terms (B, H, Tq, D) added to P v, for probabilities p
  // (B, H, Tq, Tk) (Shaw: sum_j p_ij a^V_ij).
  virtual Var value_terms(const Var& p, int64_t q0, int64_t k0) const { return Var(); }

 private:
  PositionalNeeds needs_;
};

class Positional : public Module {
 public:
  // Token embeddings x (B, T, C) of positions start..start+T-1, with the
  // absolute positions added (learned, sinusoidal); unchanged by default.
  virtual Var embed(const Var& x, int64_t start) const { return x; }
  // How many positions the scheme can represent (a learned table's rows),
  // or -1 for any number.
  virtual int64_t max_positions() const { return -1; }
  // The part inside one attention layer (parameters included, e.g. Shaw's).
  virtual std::shared_ptr<PositionalLayer> make_layer(Rng& rng) const {
    return std::make_shared<PositionalLayer>();
  }
};

struct PositionalKind {
  std::string name;
  std::string summary;    // one line, for errors and docs
  PositionalNeeds needs;  // the same as its layers' needs()
  std::vector<ModelOption> options;  // the model.* keys it reads
  std::function<std::shared_ptr<Positional>(const ModelConfig&, Rng&)> make;
  // Parameters it adds to a model of this config, all layers together (in
  // double, like AttentionKind::parameters).
  std::function<double(const ModelConfig&)> parameters;
  // Throws Error naming the key when the config's values do not suit it.
  std::function<void(const ModelConfig&)> check;
};

// The table of positional schemes (layers/positional/registry.cpp). A
// program may add its own at start-up: positional_kinds().add({...}).
Registry<PositionalKind>& positional_kinds();

// ALiBi's head slopes (Press et al.): for n a power of two 2^(-8 h / n),
// h = 1..n; otherwise the slopes for the largest power of two n' < n, then
// every other slope of the 2n' sequence until there are n.
std::vector<float> alibi_slopes(int64_t n_head);

}  // namespace tapeformer
