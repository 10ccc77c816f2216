#include "tapeformer/layers/language_model.h"

#include "tapeformer/core/error.h"
#include "tapeformer/layers/spalm.h"
#include "tapeformer/layers/transformer.h"

namespace tapeformer {

Var LanguageModel::forward(const IndexTensor&, SegmentMemory&, Rng&) const {
  fail("model.arch \"", config().arch, "\" keeps no segment memory (model.mem_len)");
}

namespace {
[[noreturn]] void no_features(const LanguageModel& model) {
  fail("model.arch \"", model.config().arch,
       "\" does not expose the context vectors its output head reads (LanguageModel::features), which kNN-LM "
       "needs");
}
}  // namespace

Var LanguageModel::forward_retrieved(const IndexTensor& ids, const IndexTensor& retrieved, SegmentMemory* memory,
                                     Rng& rng) const {
  TAPEFORMER_CHECK(retrieved.data.empty(), "model.arch \"", config().arch, "\" reads no retrieved tokens, got ",
                   retrieved.shape);
  return memory != nullptr ? forward(ids, *memory, rng) : forward(ids, rng);
}

Var LanguageModel::forward_retrieved(const IndexTensor& ids, const IndexTensor& retrieved, InferenceState& state) const {
  TAPEFORMER_CHECK(retrieved.data.empty(), "model.arch \"", config().arch, "\" reads no retrieved tokens, got ",
                   retrieved.shape);
  return forward(ids, state);
}

Var LanguageModel::features(const IndexTensor&, SegmentMemory*, Rng&) const { no_features(*this); }
Var LanguageModel::features(const IndexTensor&, InferenceState&) const { no_features(*this); }
Var LanguageModel::logits_from_features(const Var&) const { no_features(*this); }

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
