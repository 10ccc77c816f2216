#include "tapeformer/layers/language_model.h"

#include <algorithm>

#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/storage.h"
#include "tapeformer/layers/adaptive_depth.h"
#include "tapeformer/layers/spalm.h"
#include "tapeformer/layers/transformer.h"

namespace tapeformer {

ModelKind early_exit_model_kind();            // layers/models/early_exit.cpp
ModelKind decision_transformer_model_kind();  // layers/models/decision_transformer.cpp

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
                      TransformerLM::footprint,
                      nullptr,
                      nullptr},
                     spalm_model_kind(), early_exit_model_kind(), decision_transformer_model_kind()});
  return kinds;
}

std::unique_ptr<LanguageModel> make_model(const ModelConfig& cfg, Rng& rng) {
  const ModelKind& kind = model_kinds().get(cfg.arch);
  std::unique_ptr<LanguageModel> model = kind.make(cfg, rng);
  // What the memory check and the run's report count must be the model's.
  const double counted = kind.footprint(cfg).parameters, built = static_cast<double>(model->num_parameters());
  TAPEFORMER_CHECK(counted == built, "model.arch \"", kind.name, "\" with model.block \"", cfg.block,
                   "\", model.positional \"", cfg.positional, "\" and its memories: the kinds' entries count ", counted,
                   " parameters (ModelKind::footprint, BlockKind, PositionalKind and MemoryKind parameters) but the "
                   "model it builds has ", built);
  return model;
}

ModelFootprint model_footprint(const ModelConfig& cfg) { return model_kinds().get(cfg.arch).footprint(cfg); }

void LanguageModel::set_recompute(int64_t every) {
  TAPEFORMER_CHECK(every >= 0, "recompute every ", every, " layers: must be >= 0 (0: none)");
  recompute_every_ = every;
  visit([every](Module& m) {
    if (auto* stack = dynamic_cast<BlockStack*>(&m)) stack->set_recompute(every);
  });
}

bool LanguageModel::set_full_depth(bool full) {
  bool any = false;
  visit([full, &any](Module& m) {
    if (auto* adaptive = dynamic_cast<AdaptiveDepth*>(&m)) adaptive->set_full_depth(full), any = true;
  });
  return any;
}

double activation_floats(LanguageModel& model) { return activation_floats(model, model.config().block_size); }

std::optional<double> activation_floats_floor(const ModelConfig& cfg, int64_t recompute_every) {
  constexpr int64_t kShort = 512, kLong = 1024;
  const auto T = static_cast<double>(cfg.block_size);
  if (T <= kLong) return std::nullopt;
  double shorter = 0, longer = 0;
  try {
    ModelConfig probe_cfg = cfg;
    probe_cfg.block_size = kLong;
    Rng rng(0);  // its own weights: the run's initialisation stream is untouched
    const std::unique_ptr<LanguageModel> probe = make_model(probe_cfg, rng);
    probe->set_recompute(recompute_every);
    shorter = activation_floats(*probe, kShort);
    longer = activation_floats(*probe, kLong);
  } catch (const Error&) {  // a kind that cannot be this short (a block tied to other sizes)
    return std::nullopt;
  }
  const double slope = std::max(0.0, (longer - shorter) / static_cast<double>(kLong - kShort));
  return longer + slope * (T - static_cast<double>(kLong));
}

double activation_floats(LanguageModel& model, int64_t T) {
  const ModelConfig& cfg = model.config();
  const IndexTensor ids({1, T}, std::vector<int32_t>(static_cast<size_t>(T), 0));
  const ModelKind& kind = model_kinds().get(cfg.arch);
  const ModelInputs inputs = kind.example_inputs ? kind.example_inputs(cfg, 1, T) : ModelInputs();
  const bool was_training = model.is_training();
  model.train();
  Rng rng(0);
  SegmentMemory memory;
  ModelContext ctx;
  ctx.rng = &rng;
  ctx.inputs = &inputs;
  if (model.memory_use().carried()) {
    ctx.memory = &memory;
    NoGradGuard no_grad;
    model.forward(ids, ctx);  // fills the memories
  }
  const int64_t before = Storage::live_bytes();
  double kept = 0;
  {
    const Var logits = model.forward(ids, ctx);
    kept = static_cast<double>(Storage::live_bytes() - before) / static_cast<double>(sizeof(Scalar));
  }
  model.zero_statistics();  // the measurement is no batch of the run
  model.train(was_training);
  return kept;
}

}  // namespace tapeformer
