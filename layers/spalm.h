// SPALM (Yogatama, de Masson d'Autume and Kong 2021, "Adaptive
// Semiparametric Language Models", TACL 9): a Transformer-XL (its segment
// memory is the short-term memory) whose output reads, at every position,
// K tokens retrieved from a long-term memory: a kNN datastore of (context
// vector, next token) pairs (retrieval/datastore.h) searched with a frozen,
// pretrained model's context vector. The model kind "spalm" (model.arch).
//
//   ModelConfig cfg = ...;                     // a Transformer-XL: positional "txl", mem_len > 0
//   cfg.arch = "spalm";
//   cfg.options["spalm_k"] = int64_t{4};       // K
//   SpalmLM model(cfg, rng);
//   ModelInputs inputs{{"retrieved", retrieved}};                        // (B, T, K)
//   ModelContext ctx;  ctx.memory = &memory;  ctx.rng = &rng;  ctx.inputs = &inputs;
//   Var logits = model.forward(ids, ctx);                                 // ids (B, T) -> (B, T, V)
//
// The math (§2.3 of the paper, in our words). h_t (C) is the XL's last
// hidden state at position t (here ln_f's output, the vector the output head
// reads); y_1 .. y_K are the tokens retrieved for t (the values of the
// neighbours of the retriever's query), each embedded with the model's own
// token embedding E (tied with the output head in the paper): e_k = E[y_k].
// Attention over them with h_t as the query:
//   m_t = sum_k a_k e_k,   a = softmax_k(e_k . h_t)
// a scalar gate read off h_t:
//   g_t = sigmoid(w_g . h_t + b_g)
// and the mixture the output head reads:
//   z_t = g_t h_t + (1 - g_t) m_t,    p(x_{t+1} | x_<=t) = softmax(head(z_t))
// g_t = 1 is the XL alone, g_t = 0 the long-term memory alone. The paper's
// g_t = sigmoid(w_g^T h_t) has no bias; b_g is ours, so that the gate can be
// closed outright: with b_g = +inf (or any b_g large enough that sigmoid
// rounds to 1, with w_g = 0) g_t is exactly 1, 1 - g_t exactly 0, and
// z_t = 1 * h_t + 0 * m_t = h_t bit for bit (m_t is a convex combination of
// embedding rows, always finite), so SPALM equals the XL it wraps
// (tests/layers/test_spalm.cpp). Retrieved ids of -1 (a search that found
// fewer than K) are left out of the softmax; a position with none keeps h_t
// (g_t = 1 there).
//
// Checkpoint keys: the wrapped TransformerLM's own ("tok_emb.weight",
// "0.attn...", ...), so an XL checkpoint's weights load into it, plus
// "spalm_gate.weight" [C, 1] (w_g, starts at 0) and "spalm_gate.bias" [1]
// (b_g, starts at model.spalm_gate_bias). Where the retrieved tokens come
// from (the frozen retriever, the store, leaving a position's own entry out
// in training) is train/hooks/spalm.h's business (the kind's hooks): the model
// reads them as the extra input "retrieved".
#pragma once

#include <memory>

#include "tapeformer/layers/basic.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/layers/transformer.h"

namespace tapeformer {

// z = g h + (1 - g) m of the math above, composed of autograd ops (so its
// gradient is theirs; gradchecked in tests/layers/test_spalm.cpp):
// h (B, T, C), retrieved (B, T, K) ids in [-1, V) (-1: none), embedding E
// [V, C], gate_weight [C, 1], gate_bias [1] -> z (B, T, C). Error naming
// the shapes, or the first id out of range.
Var spalm_mix(const Var& h, const IndexTensor& retrieved, const Var& embedding, const Var& gate_weight,
              const Var& gate_bias);

// The model kind "spalm": options model.spalm_k (K), model.spalm_gate_bias
// (b_g's initial value) and, read by train/hooks/spalm.h when training,
// model.spalm_store, model.spalm_retriever, model.spalm_nprobe and
// model.spalm_init.
class SpalmLM : public LanguageModel {
 public:
  // The extra input it reads: K retrieved token ids per position, (B, T, K), -1 where none.
  static constexpr const char* kRetrieved = "retrieved";

  // Error unless the config is a Transformer-XL (model.mem_len > 0) and
  // model.spalm_k is in [1, 4096].
  SpalmLM(const ModelConfig& cfg, Rng& rng);

  // ids (B, T) with ctx.inputs["retrieved"] (B, T, K) -> logits (B, T, V),
  // or z (B, T, C), the vectors the head reads (ctx.features); the memory,
  // state and rng go to the XL. Without retrieved tokens it refuses.
  Var forward(const IndexTensor& ids, const ModelContext& ctx) const override;
  using LanguageModel::forward;
  int64_t k() const { return k_; }

  // Reading piece by piece (sampling, train/sample.h): the XL's state.
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window = 0) const override;

  MemoryUse memory_use() const override { return lm->memory_use(); }
  Var logits_from_features(const Var& features) const override { return lm->logits_from_features(features); }
  int64_t max_positions() const override { return lm->max_positions(); }
  const ModelConfig& config() const override { return lm->config(); }
  static ModelFootprint footprint(const ModelConfig& cfg);

  std::shared_ptr<TransformerLM> lm;    // the Transformer-XL (keys without a prefix)
  std::shared_ptr<Linear> gate;         // "spalm_gate": w_g [C, 1], b_g [1]

 private:
  int64_t k_;
};

// The kind's table entry (layers/language_model.cpp lists it).
ModelKind spalm_model_kind();

}  // namespace tapeformer
