#include "tapeformer/train/model_hooks.h"

namespace tapeformer {

ModelHooksKind spalm_model_hooks();                 // hooks/spalm.cpp
ModelHooksKind decision_transformer_model_hooks();  // hooks/decision_transformer.cpp

Registry<ModelHooksKind>& model_hooks_kinds() {
  static Registry<ModelHooksKind> kinds("model.arch (hooks)", {spalm_model_hooks(), decision_transformer_model_hooks()});
  return kinds;
}

std::unique_ptr<ModelHooks> make_model_hooks(const HookSite& site) {
  TAPEFORMER_CHECK(site.cfg != nullptr, "make_model_hooks: no config");
  if (const ModelHooksKind* kind = model_hooks_kinds().find(site.cfg->model.arch)) return kind->make(site);
  return std::make_unique<ModelHooks>();
}

void initialise_model(const HookSite& site, LanguageModel& model) {
  TAPEFORMER_CHECK(site.cfg != nullptr, "initialise_model: no config");
  const ModelHooksKind* kind = model_hooks_kinds().find(site.cfg->model.arch);
  if (kind != nullptr && kind->initialise) kind->initialise(site, model);
}

void ReadHooks::check(const std::string& who) const {
  if (model == nullptr || mixture == nullptr || !mixture->mixes()) return;
  const std::string why = model->refuses_mixture();
  TAPEFORMER_CHECK(why.empty(), who, ": a kNN-LM mixture does not apply: ", why);
}

std::string task_run_origin(const std::string& arch) {
  if (const ModelHooksKind* kind = model_hooks_kinds().find(arch))
    return "model.arch \"" + arch + "\" (" + kind->summary + ")";
  return "a program's own task (a synthetic task), which only that program reads";
}

}  // namespace tapeformer
