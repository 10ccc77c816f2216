// The Decision Transformer (Chen et al. 2021): offline RL as sequence
// modelling, the model kind "decision_transformer". A causal Transformer
// (any registered attention, positional scheme and block) reads, for each
// step t of a window of K = model.block_size steps, the tokens
//
//   a_{t-1}, R_t, s_t        (R_t = r_t + r_{t+1} + ..., the return still to come)
//
// and predicts a_t from its output at s_t: logits (B, K, A), A =
// model.vocab_size actions. a_{-1} is a start token (id A). So that the
// model is a language model like any other, the previous action comes first
// in each step: ids[t] = a_{t-1} are the ids, and the output at step t reads
// ids up to t, never a_t (the original orders R_t, s_t, a_t; the information
// each prediction sees is the same). The rest of the step comes as extra
// inputs (ModelContext::inputs):
//
//   "states"    (B, K, F)  categorical features, feature f in 0..sizes[f]-1 (model.dt_state_sizes)
//   "returns"   (B, K)     R_t, integers, embedded as R_t / model.dt_return_scale
//   "timesteps" (B, K)     t in the episode, capped at model.dt_max_timestep
//
// Embeddings: a Linear(1 -> C) of the scaled return, a table per state
// feature (summed), a table of A + 1 actions, each plus a learned table of
// the timestep; a LayerNorm, then the stack over the 3K tokens, ln_f and the
// action head. Without returns (model.dt_returns = false) the steps are
// a_{t-1}, s_t: behaviour cloning with the same backbone.
//
// A block kind with a segment memory (gtrxl, post_ln, ...) and model.mem_len
// > 0 carry the layers' inputs at the last mem_len steps (3 mem_len tokens, 2 without returns)
// from one segment of K steps to the next (Transformer-XL): training reads
// each episode in order, K steps at a time, from its start (EpisodeStreams),
// and acting reads it alike, so a cue seen many windows ago can still decide
// an action.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/layers/basic.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/layers/positional/positional.h"

namespace tapeformer {

class DecisionTransformer : public LanguageModel {
 public:
  static constexpr const char* kStates = "states";
  static constexpr const char* kReturns = "returns";
  static constexpr const char* kTimesteps = "timesteps";

  DecisionTransformer(const ModelConfig& cfg, Rng& rng);
  // ids (B, K): the previous actions (A: none) -> action logits (B, K, A).
  Var forward(const IndexTensor& ids, const ModelContext& ctx) const override;
  using LanguageModel::forward;
  // Re-reads the steps so far (the last `window`, default K) for each new
  // one; with a memory, the unfinished segment over the memory of the finished ones.
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window = 0) const override;
  // model.mem_len steps of segment memory (3 tokens each, 2 without returns), or none.
  MemoryUse memory_use() const override;
  const ModelConfig& config() const override { return cfg_; }
  int64_t max_positions() const override { return cfg_.block_size; }
  static ModelFootprint footprint(const ModelConfig& cfg);
  // model.dt_state_sizes parsed: categories of each state feature.
  static std::vector<int64_t> state_sizes(const ModelConfig& cfg);
  // The backbone's config: block_size and mem_len in tokens (tokens per step x steps).
  static ModelConfig stack_config(const ModelConfig& cfg);

  std::shared_ptr<Linear> return_emb;                  // "return_emb", 1 -> C (null without returns)
  std::vector<std::shared_ptr<Embedding>> state_emb;   // "state_emb_0", ... (sizes[f], C)
  std::shared_ptr<Embedding> action_emb;               // "action_emb", (A + 1, C)
  std::shared_ptr<Embedding> time_emb;                 // "time_emb", (max_timestep + 1, C)
  std::shared_ptr<LayerNorm> embed_ln;                 // "embed_ln"
  std::shared_ptr<Positional> pos_emb;                 // "pos_emb": the scheme over the tokens
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<BlockStack> stack;                   // the layers, inline ("0.*", ...)
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> head;                        // "head", C -> A

 private:
  // The tokens (B, P K, C) of ids (B, K) and the extra inputs.
  Var tokens(const IndexTensor& ids, const ModelInputs& inputs) const;
  // The action logits from the stack's output over the tokens, (B, K, A).
  Var actions(const Var& h, int64_t K) const;
  ModelConfig cfg_;
  int64_t per_step_;  // tokens per step: 3, or 2 without returns
  std::vector<int64_t> sizes_;
  float return_scale_;
  int64_t max_timestep_;
};

}  // namespace tapeformer
