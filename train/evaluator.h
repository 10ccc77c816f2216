// Evaluation: the one place that reads data through a model for its loss or
// its features. The Trainer's periodic and final evaluations, `eval`,
// `knn build`, SPALM's retrieval and bench/knn_sweep all go through it, and
// a model kind's hooks (its extra inputs) and a mixture (kNN-LM's) enter it
// the same way for all of them (train/model_hooks.h).
//
//   Evaluator ev(model, {hooks.get(), mixture.get()});          // model in eval mode
//   const Evaluator::TextLoss r = ev.text_loss(text, /*T=*/64, /*mem_limit=*/0);
//   ev.read_text(text, 64, 0, /*features=*/true, [&](const Window& w, const Var& f) { ... });   // f (1, W, C)
//
// A text is read as train/windows.h says: windows of T tokens, one stream
// for a model that carries a segment memory (kept at mem_limit positions, 0:
// the model's mem_len), each window's re-fed tokens (ext_len) not counted.
// Results do not depend on anything but the model, the text and T: no
// dropout is drawn (eval mode), no gradient kept.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tapeformer/core/rng.h"
#include "tapeformer/data/sampler.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/train/data_parallel.h"
#include "tapeformer/train/model_hooks.h"
#include "tapeformer/train/windows.h"

namespace tapeformer {

class Evaluator {
 public:
  // hooks: the model kind's and a mixture (either may be null); hooks that
  // refuse the mixture beside it are an Error (ReadHooks::check).
  explicit Evaluator(const LanguageModel& model, ReadHooks hooks = {});

  // fn(window, output) for each window of `text`, in order: the logits
  // (1, W, V), or with `features` the context vectors (1, W, C). Calls the
  // hooks' begin_text first and takes each window's extra inputs from them.
  // Within a command's ProgressScope (train/metrics.h) the windows read show
  // as a WorkProgress: "eval: reading 1,115,394 tokens of 'x.txt' in 8,714
  // windows of 128", then "eval: 4,000/8,714 windows (45%) | ...".
  void read_text(const EvalText& text, int64_t T, int64_t mem_limit, bool features,
                 const std::function<void(const Window&, const Var&)>& fn) const;

  // -sum log p(y) over the text's predicted positions and their count; with
  // a mixture that mixes, the mixture's, with the model's own in lm_loss_sum
  // (else lm_loss_sum = loss_sum).
  struct TextLoss {
    double loss_sum = 0, lm_loss_sum = 0;
    int64_t counted = 0;
  };
  TextLoss text_loss(const EvalText& text, int64_t T, int64_t mem_limit) const;

  // The Trainer's evaluations, data-parallel over `shards` (whose model this
  // is): the mean loss of `batches` (random windows, each scored whole, the
  // means averaged in batch order); and the mean loss of the first n batches
  // of `source` read in order with a fresh memory of mem_limit positions,
  // the hooks' batches(source, eval = true) wrapping it.
  double batches_loss(DataParallel& shards, const std::vector<Batch>& batches, Rng& rng) const;
  double stream_loss(DataParallel& shards, BatchSource& source, int64_t n, int64_t mem_limit, Rng rng) const;

 private:
  const LanguageModel& model_;
  ModelHooks* hooks_;   // or null
  Mixture* mixer_;      // a mixture that mixes, or null
};

}  // namespace tapeformer
