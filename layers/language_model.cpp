#include "tapeformer/layers/language_model.h"

#include "tapeformer/core/error.h"
#include "tapeformer/layers/spalm.h"
#include "tapeformer/layers/transformer.h"

namespace tapeformer {

Var LanguageModel::forward(const IndexTensor& ids, Rng& rng) const {
  ModelContext ctx;
  ctx.rng = &rng;
  return forward(ids, ctx);
}

Var LanguageModel::forward(const IndexTensor& ids, SegmentMemory& memory, Rng& rng) const {
  ModelContext ctx;
  ctx.rng = &rng;
  ctx.memory = &memory;
  return forward(ids, ctx);
}

Var LanguageModel::forward(const IndexTensor& ids, InferenceState& state) const {
  ModelContext ctx;
  ctx.state = &state;
  return forward(ids, ctx);
}

Var LanguageModel::logits_from_features(const Var&) const {
  fail("model.arch \"", config().arch,
       "\" does not expose the context vectors its output head reads (LanguageModel::logits_from_features), which "
       "kNN-LM needs");
}

Registry<ModelKind>& model_kinds() {
  static Registry<ModelKind> kinds(
      "model.arch", {{"transformer",
                      "GPT: token and position embeddings, model.block's stack of attention and MLP layers, ln_f, head",
                      {},
                      [](const ModelConfig& cfg, Rng& rng) -> std::unique_ptr<LanguageModel> {
                        return std::make_unique<TransformerLM>(cfg, rng);
                      },
                      TransformerLM::footprint},
                     spalm_model_kind()});
  return kinds;
}

std::unique_ptr<LanguageModel> make_model(const ModelConfig& cfg, Rng& rng) {
  return model_kinds().get(cfg.arch).make(cfg, rng);
}

ModelFootprint model_footprint(const ModelConfig& cfg) { return model_kinds().get(cfg.arch).footprint(cfg); }

}  // namespace tapeformer
