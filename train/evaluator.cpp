#include "tapeformer/train/evaluator.h"

#include <algorithm>
#include <optional>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"

namespace tapeformer {

Evaluator::Evaluator(const LanguageModel& model, std::vector<ModelHooks*> hooks) : model_(model) {
  for (ModelHooks* h : hooks)
    if (h != nullptr) hooks_.push_back(h);
  for (ModelHooks* h : hooks_)
    if (h->mixes()) {
      TAPEFORMER_CHECK(mixer_ == nullptr, "Evaluator: two hooks mix the next-token distribution");
      mixer_ = h;
    }
  if (mixer_ != nullptr)
    for (const ModelHooks* h : hooks_) {
      const std::string why = h->refuses_mixture();
      TAPEFORMER_CHECK(why.empty(), "a kNN-LM mixture does not apply: ", why);
    }
}

void Evaluator::read_text(const EvalText& text, int64_t T, int64_t mem_limit, bool features,
                          const std::function<void(const Window&, const Var&)>& fn) const {
  for (ModelHooks* h : hooks_) h->begin_text(text, text.path, text.split, text.val_fraction);
  NoGradGuard no_grad;
  const MemoryUse use = model_.memory_use();
  // A model with a segment memory reads the text as one stream, segment by
  // segment, carrying its memories; with ext_len e each segment also starts
  // with the e tokens before it again, their targets not counted.
  SegmentMemory memory;
  memory.limit = mem_limit;
  ModelInputs inputs;
  for_each_window(text.ids, T, use.carried() ? use.ext_len : 0, [&](const Window& w) {
    inputs.clear();
    for (const ModelHooks* h : hooks_) h->window_inputs(w, inputs);
    ModelContext ctx;
    ctx.memory = use.carried() ? &memory : nullptr;
    ctx.inputs = inputs.empty() ? nullptr : &inputs;
    ctx.features = features;
    fn(w, model_.forward(w.ids, ctx));
  });
}

Evaluator::TextLoss Evaluator::text_loss(const EvalText& text, int64_t T, int64_t mem_limit) const {
  TextLoss r;
  if (mixer_ != nullptr) {
    read_text(text, T, mem_limit, /*features=*/true, [&](const Window& w, const Var& f) {
      mixer_->score(f.value(), model_.logits_from_features(f).value(), w);  // logits as forward() computes them
    });
    const ModelHooks::Sums s = mixer_->finish();
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
  double total = 0;
  for (double loss : shards.losses(batches, rng)) total += loss;  // in batch order
  return total / static_cast<double>(batches.size());
}

double Evaluator::stream_loss(DataParallel& shards, BatchSource& source, int64_t n, int64_t mem_limit, Rng rng) const {
  std::vector<std::unique_ptr<BatchSource>> wrapped;
  BatchSource* val = &source;
  for (ModelHooks* h : hooks_) {
    if (std::unique_ptr<BatchSource> w = h->val_source(*val)) {
      wrapped.push_back(std::move(w));
      val = wrapped.back().get();
    }
  }
  SegmentMemory memory;
  memory.limit = mem_limit;
  double total = 0;
  NoGradGuard no_grad;
  for (int64_t i = 0; i < n; ++i) total += shards.train_batch(val->next(), 1.0f, rng, &memory);
  return total / static_cast<double>(n);
}

}  // namespace tapeformer
