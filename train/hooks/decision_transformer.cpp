// The Decision Transformer's hooks (layers/models/decision_transformer.h):
// it trains on episodes of an environment, never on a text, so a run that
// would read text windows, a text read for eval and sampling are refused. A
// program's task (its own batch source of episode windows, as `tapeformer rl
// train` gives it) trains it through the stock Trainer.
#include "tapeformer/core/error.h"
#include "tapeformer/train/model_hooks.h"

namespace tapeformer {
namespace {

class DecisionTransformerHooks : public ModelHooks {
 public:
  explicit DecisionTransformerHooks(const HookSite& site) : task_(!site.task.empty()) {}
  BatchSource* batches(BatchSource&, bool) override {
    TAPEFORMER_CHECK(task_, "model.arch \"decision_transformer\" trains on episodes of an environment (a program's "
                            "batch source of episode windows), not on a text");
    return nullptr;
  }
  void begin_text(const EvalText& text) override {
    fail("model.arch \"decision_transformer\" reads episodes, not the text '", text.path, "'");
  }
  void sample_inputs(const IndexTensor&, bool, ModelInputs&) override {
    fail("model.arch \"decision_transformer\" acts in an environment: it samples no text");
  }

 private:
  bool task_;
};

}  // namespace

ModelHooksKind decision_transformer_model_hooks() {
  return {"decision_transformer", "episodes of an environment: train it with tapeformer rl train, act with rl eval; "
                                  "text training, evaluation and sampling are refused",
          [](const HookSite& site) -> std::unique_ptr<ModelHooks> {
            return std::make_unique<DecisionTransformerHooks>(site);
          }};
}

}  // namespace tapeformer
