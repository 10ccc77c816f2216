// What a model kind needs around the training loop, evaluation and sampling
// beyond forward(): its batch sources wrapped, extra inputs for a text or a
// sampled sequence, files kept in the run's directory, starting weights, and
// a mixture of its next-token log-probabilities. The Trainer, `eval`,
// `sample`, `knn build` and bench/knn_sweep call these the same way for every
// model; they name no kind. A kind without an entry gets the defaults
// (nothing added), so a program's own model kind needs none.
//
//   std::vector<std::unique_ptr<ModelHooks>> hooks = make_model_hooks(site);  // the kind's, by model.arch
//   BatchSource& train = hooks_train_source(hooks, inner);
//
// The table is keyed by model.arch: SPALM's entry (train/spalm.cpp) adds the
// tokens its frozen retriever finds for every position. kNN-LM's mixture
// (train/knn.h) is a ModelHooks too, which eval and sample add for --knn.
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

class ModelHooks {
 public:
  virtual ~ModelHooks() = default;

  // ---- training ----
  // The Trainer's batches, read from `inner` (SPALM adds each row's retrieved tokens).
  virtual BatchSource& train_source(BatchSource& inner) { return inner; }
  // One evaluation's batches of the val split, read from `inner`; null: `inner` as it is.
  virtual std::unique_ptr<BatchSource> val_source(BatchSource& inner) { return nullptr; }
  // Files it keeps in run_dir (their leftovers of atomic writes are removed
  // with the checkpoint's), and writing them (rank 0, once the directory exists).
  virtual std::vector<std::string> files(const std::string& run_dir) const { return {}; }
  virtual void keep(const std::string& run_dir) const {}
  // A fresh run's starting weights (SPALM: its retriever's).
  virtual void initialise(LanguageModel& model) const {}

  // ---- a text read window by window (eval, knn build) ----
  // The text about to be read: its tokens, and how it was cut from `path`
  // (split "all", "train" or "val" of a run with `val_fraction`).
  virtual void begin_text(const EvalText& text, const std::string& path, const std::string& split,
                          double val_fraction) {}
  // The extra inputs of one window.
  virtual void window_inputs(const Window& w, ModelInputs& inputs) const {}

  // ---- sampling ----
  // The extra inputs of the tokens generate() feeds, ids (1, T); `restart`:
  // the model's state was just reset and ids is the window read afresh.
  virtual void sample_inputs(const IndexTensor& ids, bool restart, ModelInputs& inputs) {}

  // ---- a mixture of the next-token distribution ----
  // Why the model cannot take a mixture (kNN-LM's) beside these hooks, or "".
  virtual std::string refuses_mixture() const { return ""; }
  // Whether mix() and score() change anything (they need the model's features).
  virtual bool mixes() const { return false; }
  // Sampling: one position's logits (V) at features (C) become the
  // log-probabilities sampled from.
  virtual void mix(const Scalar* features, int64_t C, Scalar* logits, int64_t V) const {}
  // Evaluation: one window's features (1, W, C) and logits (1, W, V); its
  // predicted positions' losses are summed by finish().
  virtual void score(const Tensor& features, const Tensor& logits, const Window& w) {}
  // The mixture's sums over the windows scored: -sum log p(y), -sum log p_LM(y), positions.
  struct Sums {
    double loss = 0, lm_loss = 0;
    int64_t counted = 0;
  };
  virtual Sums finish() { return {}; }
};

struct ModelHooksKind {
  std::string name;  // the model.arch it serves
  std::string summary;
  std::function<std::unique_ptr<ModelHooks>(const HookSite&)> make;
};

// The table of hooks by model.arch (train/model_hooks.cpp; SPALM's entry is
// train/spalm.cpp's). A program may add an entry for its own model kind.
Registry<ModelHooksKind>& model_hooks_kinds();

// The hooks of site.cfg's model.arch, or the defaults.
std::unique_ptr<ModelHooks> make_model_hooks(const HookSite& site);

// What trained a run whose checkpoint holds no tokenizer, for the errors of
// the commands that need a text: the summary of its model.arch's hooks
// ("model.arch \"decision_transformer\": episodes only, ...") or a
// program's own task.
std::string task_run_origin(const std::string& arch);

}  // namespace tapeformer
