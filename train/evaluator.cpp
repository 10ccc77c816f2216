#include "tapeformer/train/evaluator.h"

#include <algorithm>
#include <optional>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/signals.h"

namespace tapeformer {

Evaluator::Evaluator(const LanguageModel& model, ReadHooks hooks)
    : model_(model), hooks_(hooks.model), mixer_(hooks.mixture && hooks.mixture->mixes() ? hooks.mixture : nullptr) {
  hooks.check("eval");
}

void Evaluator::read_text(const EvalText& text, int64_t T, int64_t mem_limit, bool features,
                          const std::function<void(const Window&, const Var&)>& fn) const {
  if (hooks_) hooks_->begin_text(text);
  NoGradGuard no_grad;
  const MemoryUse use = model_.memory_use();
  // A model with a segment memory reads the text as one stream, segment by
  // segment, carrying its memories; with ext_len e each segment also starts
  // with the e tokens before it again, their targets not counted.
  SegmentMemory memory;
  memory.limit = mem_limit;
  ModelInputs inputs;
  const std::string phase = "the reading of '" + text.path + "'";
  const int64_t ext_len = use.carried() ? use.ext_len : 0;
  const int64_t windows = count_windows(static_cast<int64_t>(text.ids.size()), T, text.align);
  std::string what = "reading " + grouped(static_cast<int64_t>(text.ids.size())) + " tokens";
  if (!text.path.empty()) what += " of '" + text.path + "'";
  if (!text.split.empty() && text.split != "all") what += " (" + text.split + " split)";
  WorkProgress progress(what + " in " + grouped(windows) + " windows of " + grouped(T), windows, "windows");
  int64_t done = 0;
  for_each_window(text.ids, T, ext_len, [&](const Window& w) {
    stop_point(nullptr, phase);  // one process: eval, knn build, a kind's tables
    inputs.clear();
    if (hooks_) hooks_->window_inputs(w, inputs);
    ModelContext ctx;
    ctx.memory = use.carried() ? &memory : nullptr;
    ctx.inputs = inputs.empty() ? nullptr : &inputs;
    ctx.features = features;
    fn(w, model_.forward(w.ids, ctx));
    progress.update(++done);
  }, text.align);
  progress.done();
}

Evaluator::TextLoss Evaluator::text_loss(const EvalText& text, int64_t T, int64_t mem_limit) const {
  TextLoss r;
  if (mixer_ != nullptr) {
    read_text(text, T, mem_limit, /*features=*/true, [&](const Window& w, const Var& f) {
      mixer_->score(f.value(), model_.logits_from_features(f).value(), w);  // logits as forward() computes them
    });
    const Mixture::Sums s = mixer_->finish();
    return {s.loss, s.lm_loss, s.counted};
  }
  read_text(text, T, mem_limit, /*features=*/false, [&](const Window& w, const Var& logits) {
    r.loss_sum += cross_entropy(logits, w.targets).item() * static_cast<double>(w.len);
    r.counted += w.len;
  });
  r.lm_loss_sum = r.loss_sum;
  return r;
}

double Evaluator::batches_loss(DataParallel& shards, const std::vector<Batch>& batches, Rng& rng) const {
  // In pieces of two batches per thread and rank, so that a signal stops it
  // within a piece; each batch's loss, and their sum in batch order, are
  // what one call over all of them gives.
  ProcessGroup* group = shards.group().get();
  const size_t piece = static_cast<size_t>(2 * parallel::num_threads() * (group ? group->size() : 1));
  double total = 0;
  for (size_t b0 = 0; b0 < batches.size(); b0 += piece) {
    stop_point(group, "the evaluation");
    const std::vector<Batch> some(batches.begin() + static_cast<std::ptrdiff_t>(b0),
                                  batches.begin() + static_cast<std::ptrdiff_t>(std::min(batches.size(), b0 + piece)));
    for (double loss : shards.losses(some, rng)) total += loss;  // in batch order
  }
  return total / static_cast<double>(batches.size());
}

double Evaluator::stream_loss(DataParallel& shards, BatchSource& source, int64_t n, int64_t mem_limit, Rng rng) const {
  BatchSource* wrapped = hooks_ ? hooks_->batches(source, /*eval=*/true) : nullptr;
  BatchSource* val = wrapped ? wrapped : &source;
  SegmentMemory memory;
  memory.limit = mem_limit;
  double total = 0;
  NoGradGuard no_grad;
  for (int64_t i = 0; i < n; ++i) {
    stop_point(shards.group().get(), "the evaluation");
    total += shards.train_batch(val->next(), 1.0f, rng, &memory);
  }
  return total / static_cast<double>(n);
}

}  // namespace tapeformer
