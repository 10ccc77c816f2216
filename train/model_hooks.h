// What a model kind needs around the training loop, reading a text and
// sampling, beyond forward(): its batch sources wrapped, files kept in the
// run's directory, extra inputs for a text's windows or a sampled sequence,
// and whether a next-token mixture may sit beside it. The Trainer, the
// Evaluator and generate() call these the same way for every model; they
// name no kind. A kind without an entry gets the defaults (nothing added),
// so a program's own model kind needs none.
//
//   std::unique_ptr<ModelHooks> hooks = make_model_hooks(site);   // the kind's, by model.arch
//   BatchSource* wrapped = hooks->batches(inner, /*eval=*/false);  // or null: inner as it is
//
// The table is keyed by model.arch; each kind's hooks are a file of
// train/hooks/ named after it (SPALM's retrieved tokens, the Decision
// Transformer's refusal of text). kNN-LM's mixture is not a model's hook
// but a Mixture beside any model (train/knn.h), which eval and sample add
// for --knn; ReadHooks carries both to the readers.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/core/registry.h"
#include "tapeformer/data/sampler.h"
#include "tapeformer/data/token_file.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/train/config.h"
#include "tapeformer/train/windows.h"

namespace tapeformer {

// Where hooks are made: the run's config and tokenizer, and what the caller
// has (null / empty where it has not).
struct HookSite {
  const TrainConfig* cfg = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const TokenSource* train = nullptr;  // training: the train split
  const TokenSource* val = nullptr;    //           and the val split
  std::string run_dir;                 // training: the run's directory (its kept files)
  std::string task;                    // training on a program's task (its name): no text
  int64_t context = 0;                 // sampling: the positions the model reads
};

// A file a model kind keeps in the run's directory, and its writer.
struct KeptFile {
  std::string path;
  std::function<void()> write;
};

class ModelHooks {
 public:
  virtual ~ModelHooks() = default;

  // ---- training ----
  // The batches a run reads, read from `inner`: the training steps' (eval
  // false, once per run) or one evaluation's of the val split (eval true,
  // once per evaluation); null: `inner` as it is. The hooks own what they
  // return until the next call (SPALM adds each row's retrieved tokens).
  virtual BatchSource* batches(BatchSource& inner, bool eval) { return nullptr; }
  // The files it keeps in run_dir: the run claims their paths (their
  // leftovers of interrupted atomic writes are removed with the
  // checkpoint's) and rank 0 then calls each writer once.
  virtual std::vector<KeptFile> kept_files(const std::string& run_dir) const { return {}; }

  // ---- a text read window by window (eval, knn build) ----
  // The text about to be read (with where it was cut from: EvalText's
  // path, split and val fraction), then the extra inputs of each window.
  virtual void begin_text(const EvalText& text) {}
  virtual void window_inputs(const Window& w, ModelInputs& inputs) const {}

  // ---- sampling ----
  // The extra inputs of the tokens generate() feeds, ids (1, T); `restart`:
  // the model's state was just reset and ids is the window read afresh.
  virtual void sample_inputs(const IndexTensor& ids, bool restart, ModelInputs& inputs) {}

  // Why a next-token mixture (kNN-LM's) cannot sit beside the model, or "".
  virtual std::string refuses_mixture() const { return ""; }
};

// A next-token mixture beside a model (kNN-LM's, train/knn.h): it rewrites
// each sampled position's logits, and scores a text's windows itself.
class Mixture {
 public:
  virtual ~Mixture() = default;
  // Whether mix() and score() change anything (they need the model's features).
  virtual bool mixes() const = 0;
  // Sampling: one position's logits (V) at features (C) become the
  // log-probabilities sampled from.
  virtual void mix(const Scalar* features, int64_t C, Scalar* logits, int64_t V) const = 0;
  // Evaluation: one window's features (1, W, C) and logits (1, W, V); its
  // predicted positions' losses are summed by finish().
  virtual void score(const Tensor& features, const Tensor& logits, const Window& w) = 0;
  // The sums over the windows scored: -sum log p(y), -sum log p_LM(y), positions.
  struct Sums {
    double loss = 0, lm_loss = 0;
    int64_t counted = 0;
  };
  virtual Sums finish() = 0;
};

// What reads a model beside it: its kind's hooks and a mixture (either null).
// A mixture beside hooks that refuse one is an Error where it is used.
struct ReadHooks {
  ModelHooks* model = nullptr;
  Mixture* mixture = nullptr;
  // Error "WHO: a kNN-LM mixture does not apply: WHY" when the model's hooks refuse a mixture that mixes.
  void check(const std::string& who) const;
};

struct ModelHooksKind {
  std::string name;  // the model.arch it serves
  std::string summary;
  std::function<std::unique_ptr<ModelHooks>(const HookSite&)> make;
  // A fresh run's starting weights, where the kind gives them (SPALM starts
  // as its retriever); null: the model's own initialisation.
  std::function<void(const HookSite&, LanguageModel&)> initialise = nullptr;
};

// The table of hooks by model.arch (train/model_hooks.cpp; each entry from
// its file in train/hooks/). A program may add an entry for its own model kind.
Registry<ModelHooksKind>& model_hooks_kinds();

// The hooks of site.cfg's model.arch, or the defaults.
std::unique_ptr<ModelHooks> make_model_hooks(const HookSite& site);
// A fresh run's model given its kind's starting weights, if the kind has any.
void initialise_model(const HookSite& site, LanguageModel& model);

// What trained a run whose checkpoint holds no tokenizer, for the errors of
// the commands that need a text: the summary of its model.arch's hooks
// ("model.arch \"decision_transformer\" (episodes of an environment, ...)")
// or a program's own task.
std::string task_run_origin(const std::string& arch);

}  // namespace tapeformer
