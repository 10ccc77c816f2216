#include "tapeformer/train/eval_file.h"

#include <cmath>

#include "tapeformer/core/error.h"
#include "tapeformer/train/evaluator.h"
#include "tapeformer/train/windows.h"

namespace tapeformer {

std::string weights_file(const std::string& checkpoint, const std::string& weights) {
  return weights.empty() ? checkpoint_file(checkpoint) : weights;
}

std::unique_ptr<ModelHooks> reading_hooks(const Loaded& l, int64_t context, const KnnOptions& knn, const char* who) {
  HookSite site;
  site.cfg = &l.cfg;
  site.tokenizer = l.tokenizer.get();
  if (knn.on()) {  // before the kind's hooks open anything
    HookSite probe = site;
    const std::string why = make_model_hooks(probe)->refuses_mixture();
    TAPEFORMER_CHECK(why.empty(), who, ": --knn mixes a kNN-LM into a model's output; ", why);
  }
  site.context = context;
  return make_model_hooks(site);
}

EvalResult evaluate_file(const std::string& checkpoint, const std::string& data_path, int64_t context,
                         const std::string& weights) {
  EvalArgs args;
  args.checkpoint = checkpoint;
  args.data = data_path;
  args.context = context;
  args.weights = weights;
  return evaluate_file(args);
}

EvalResult evaluate_file(const EvalArgs& args) {
  TAPEFORMER_CHECK(args.context >= 0, "eval: context must be >= 0 (0: the block size), got ", args.context);
  if (args.knn.on()) args.knn.validate();
  Loaded l = load_model(args.checkpoint, args.weights);
  const int64_t limit = l.model->max_positions();
  const int64_t T = args.context > 0 ? args.context : l.cfg.model.block_size;
  TAPEFORMER_CHECK(limit < 0 || T <= limit, "eval: context ", T, " exceeds the ", limit,
                   " positions of model.positional \"", l.cfg.model.positional,
                   "\" (its table ends at model.block_size); a positional scheme without a table takes any context");
  std::unique_ptr<ModelHooks> hooks = reading_hooks(l, 0, args.knn, "eval");  // the model kind's extra inputs
  // lambda = 0 mixes nothing: the model's own loss, bit for bit
  const std::unique_ptr<KnnMixture> mixture = knn_mixture(args.knn, l.cfg, *l.model, *l.tokenizer);
  EvalText text = read_eval_text(args.data, *l.tokenizer, args.split, l.cfg.data.val_fraction);
  text.align = l.cfg.data.align;  // records of a fixed length: the windows the run validated on
  const int64_t n = static_cast<int64_t>(text.ids.size());
  // A model with a segment memory reads the text as one stream, carrying its
  // memories (eval.mem_len positions, default model.mem_len).
  const Evaluator::TextLoss t = Evaluator(*l.model, {hooks.get(), mixture.get()}).text_loss(text, T, l.cfg.eval.mem_len);
  const double total = t.loss_sum;
  const int64_t counted = t.counted;
  const double per_char = static_cast<double>(n) / static_cast<double>(text.characters);
  const double loss = total / static_cast<double>(counted);
  TAPEFORMER_CHECK(std::isfinite(loss), "the model's loss on the data is ", std::isnan(loss) ? "nan" : "inf",
                   ": the weights in '",
                   weights_file(args.checkpoint, args.weights), "' are not usable");
  EvalResult r;
  r.loss = loss;
  r.tokens = counted;
  r.tokens_per_char = per_char;
  r.lm_loss = t.lm_loss_sum / static_cast<double>(counted);
  r.knn_keys = mixture ? mixture->keys() : 0;
  r.layers = l.model->layer_metrics();
  return r;
}

double EvalResult::bpc() const { return loss / std::log(2.0) * tokens_per_char; }
double EvalResult::perplexity() const { return std::exp(loss); }


}  // namespace tapeformer
