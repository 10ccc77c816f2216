// FeedForward, the pre-LN TransformerBlock, and TransformerLM (a GPT).
//
//   ModelConfig cfg;                     // vocab 65, block 64, 4 layers, 4 heads, width 128
//   cfg.vocab_size = 65;
//   cfg.attention = "linear";            // any registered kind (default "softmax")
//   cfg.positional = "rope";             // any registered scheme (default "learned")
//   Rng rng(1337);
//   TransformerLM model(cfg, rng);       // GPT-2 init
//   Var logits = model.forward(ids, rng);               // ids (B, T) -> (B, T, V)
//   Var loss = cross_entropy(logits, targets);
//
// Architecture (nanoGPT): x = drop(pos_emb.embed(tok_emb(ids), 0)), where the
// positional scheme adds absolute positions (learned, sinusoidal) or nothing;
// x = stack(x), by default per block x += attn(ln_1(x)); x += mlp(ln_2(x));
// logits = ln_f(x) W_head. The block stack, the attention kind and the
// scheme's part inside it come from the registries (layers/block/block.h,
// layers/attention/attention.h, layers/positional/positional.h).
// With tie_weights the head is the token embedding's transpose. Init:
// N(0, 0.02) everywhere, residual projections N(0, 0.02 / sqrt(2 * n_layer)),
// biases 0, norm gains 1.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/basic.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/block/standard.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/layers/model_config.h"
#include "tapeformer/layers/positional/positional.h"

namespace tapeformer {

// The model kind "transformer" (model.arch), the default LanguageModel.
class TransformerLM : public LanguageModel {
 public:
  TransformerLM(const ModelConfig& cfg, Rng& rng);
  // ids (B, T) -> logits (B, T, V) (or ln_f's output, ctx.features); T is at
  // most max_positions() when the positional scheme has a table (learned:
  // block_size), any length otherwise. The context's memory and state as below.
  Var forward(const IndexTensor& ids, const ModelContext& ctx) const override;
  using LanguageModel::forward;

  // Reading a sequence piece by piece (sampling): make_state(B, window)
  // holds every block's state, and forward(ids, state) takes the next T
  // positions, ids (B, T) -> logits (B, T, V), equal to the matching rows of
  // forward() on the whole sequence so far while it fits in the window (bit
  // for bit from a fresh or reset state where the attention kind says so,
  // to float rounding after that). window (0: block_size) is how many recent
  // positions softmax layers keep: past it the oldest drop out, so each
  // token costs O(window); linear attention's state is O(1) whatever the
  // length. With a learned table, state.length() + T must stay within
  // max_positions(); past that, reset() and feed the last tokens again.
  // Needs NoGradGuard and eval(). A state belongs to the model that made it;
  // after an error it is reset.
  // A model with memories (model.mem_len > 0 and the kinds built on it)
  // reads as it trained instead, whatever its positional scheme, window
  // ignored (state.segments() is true): segments of block_size positions,
  // each after the ext_len ids before it again, with its memories carried
  // from one to the next; each call recomputes the unfinished segment
  // (O(block_size) per token), and a finished one moves into the memories.
  // Its rows equal forward(ids, memory, rng) over those segments, as
  // evaluation reads them (to float rounding).
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window = 0) const override;

  // Transformer-XL training and evaluation (model.mem_len > 0, ctx.memory):
  // ids (B, T) is the segment after those the memory holds (empty: the
  // first); every layer attends to its memory, which then moves on to hold
  // each layer's inputs at the last mem_len positions. Positions restart at
  // 0 in each segment for the schemes that add them to the embeddings.
  // model.mem_len and model.ext_len: 0 when the model keeps no segment memory.
  MemoryUse memory_use() const override;
  // ln_f's output, the (B, T, C) rows the head multiplies (logits = features
  // W_head, or features E^T when tied; kNN-LM's context vectors): forward()
  // is logits_from_features(features()) in every form. memory: as
  // ctx.memory (null: none).
  Var features(const IndexTensor& ids, SegmentMemory* memory, Rng& rng) const;
  Var features(const IndexTensor& ids, InferenceState& state) const;
  Var logits_from_features(const Var& features) const override;
  const ModelConfig& config() const override { return cfg_; }
  // Positions the model can represent: the learned table's rows, or -1 for any.
  int64_t max_positions() const override { return pos_emb->max_positions(); }
  // Parameters and activation memory of a model of `cfg`, from its kinds.
  static ModelFootprint footprint(const ModelConfig& cfg);

  std::shared_ptr<Embedding> tok_emb;
  std::shared_ptr<Positional> pos_emb;  // the positional scheme (checkpoint keys "pos_emb.*")
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<BlockStack> stack;  // cfg.block's kind; its layers' keys are "0.*", "1.*", ...
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> lm_head;  // null when tied

 private:
  // features(ids, state) for a model with memories (make_state).
  Var forward_segments(const IndexTensor& ids, InferenceState& state) const;
  Var embed(const IndexTensor& ids, int64_t start) const;  // token embeddings with positions start.., (B, T, C)
  // ids (B, T) checked against the position table, embedded from position 0, with dropout: (B, T, C).
  Var embed_sequence(const IndexTensor& ids, Rng& rng) const;
  ModelConfig cfg_;
};

}  // namespace tapeformer
