#include "tapeformer/train/model_hooks.h"

namespace tapeformer {

ModelHooksKind spalm_model_hooks();                 // spalm.cpp
ModelHooksKind decision_transformer_model_hooks();  // rl_commands.cpp

Registry<ModelHooksKind>& model_hooks_kinds() {
  static Registry<ModelHooksKind> kinds("model.arch (hooks)", {spalm_model_hooks(), decision_transformer_model_hooks()});
  return kinds;
}

std::unique_ptr<ModelHooks> make_model_hooks(const HookSite& site) {
  TAPEFORMER_CHECK(site.cfg != nullptr, "make_model_hooks: no config");
  if (const ModelHooksKind* kind = model_hooks_kinds().find(site.cfg->model.arch)) return kind->make(site);
  return std::make_unique<ModelHooks>();
}

std::string task_run_origin(const std::string& arch) {
  if (const ModelHooksKind* kind = model_hooks_kinds().find(arch))
    return "model.arch \"" + arch + "\" (" + kind->summary + ")";
  return "a program's own task (a synthetic task), which only that program reads";
}

}  // namespace tapeformer
