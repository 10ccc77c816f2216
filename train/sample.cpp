#include "tapeformer/train/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "tapeformer/core/error.h"

namespace tapeformer {

void SampleOptions::validate() const {
  TAPEFORMER_CHECK(tokens >= 0, "sample: tokens must be >= 0, got ", tokens);
  TAPEFORMER_CHECK(temperature >= 0 && std::isfinite(temperature), "sample: temperature must be >= 0, got ",
                   temperature);
  TAPEFORMER_CHECK(top_k >= 0, "sample: top-k must be >= 0, got ", top_k);
  TAPEFORMER_CHECK(top_p > 0 && top_p <= 1, "sample: top-p must be in (0, 1], got ", top_p);
  TAPEFORMER_CHECK(context >= 0, "sample: context must be >= 0 (0: the block size), got ", context);
}

int64_t sample_context(const LanguageModel& model, const SampleOptions& opt) {
  const int64_t limit = model.max_positions();
  TAPEFORMER_CHECK(opt.context == 0 || !model.memory_use().carried(), "sample: context ", opt.context,
                   " does not apply to a model with memories (model.mem_len = ", model.memory_use().mem_len,
                   "): it reads the whole text in segments of model.block_size, carrying them");
  const int64_t context = opt.context > 0 ? opt.context : model.config().block_size;
  TAPEFORMER_CHECK(limit < 0 || context <= limit, "sample: context ", context, " exceeds the ", limit,
                   " positions of model.positional \"", model.config().positional,
                   "\" (its table ends at model.block_size); a positional scheme without a table takes any context");
  return context;
}

int32_t sample_token(const Scalar* logits, int64_t V, const SampleOptions& opt, Rng& rng) {
  // A NaN would break the sort's ordering and silently pick the last token.
  for (int64_t i = 0; i < V; ++i) {
    if (std::isfinite(logits[i])) continue;
    std::ostringstream what;
    what << "the model's logit for token " << i << " is "
         << (std::isnan(logits[i]) ? "nan" : logits[i] > 0 ? "inf" : "-inf");  // never printf's "-nan"
    throw NonFiniteLogits(what.str());
  }
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  // Most likely first; ties keep the lower id, so results do not depend on the sort.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (opt.temperature == 0.0f) return order[0];
  int64_t keep = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
  std::vector<double> p(keep);
  const double m = logits[order[0]];
  double z = 0;
  for (int64_t i = 0; i < keep; ++i) z += p[i] = std::exp((logits[order[i]] - m) / opt.temperature);
  if (opt.top_p < 1.0f) {
    double cum = 0;
    int64_t n = 0;
    while (n < keep && cum < opt.top_p * z) cum += p[n++];
    keep = std::max<int64_t>(n, 1);
    z = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  }
  double u = static_cast<double>(rng.uniform()) * z;
  for (int64_t i = 0; i < keep; ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order[keep - 1];  // u landed on the rounding slack at the end
}

std::vector<int32_t> generate(LanguageModel& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt, Rng& rng,
                              const std::function<void(int32_t)>& on_token, ReadHooks hooks) {
  opt.validate();
  TAPEFORMER_CHECK(!prompt.empty(), "sample: the prompt is empty (give at least one token)");
  hooks.check("sample");
  // The mixture that rewrites each distribution, if any.
  const Mixture* mixer = hooks.mixture && hooks.mixture->mixes() ? hooks.mixture : nullptr;
  const int64_t V = model.config().vocab_size, limit = model.max_positions();
  const int64_t context = sample_context(model, opt);
  for (int32_t id : prompt)
    TAPEFORMER_CHECK(id >= 0 && id < V, "sample: prompt token ", id, " is outside the vocabulary of ", V);
  // Eval mode for the draw, the caller's mode back afterwards, even on a throw.
  struct ModeRestore {
    LanguageModel& model;
    bool was_training;
    ~ModeRestore() { model.train(was_training); }
  } restore{model, model.is_training()};
  model.eval();
  NoGradGuard no_grad;
  if (opt.tokens == 0) return prompt;
  std::vector<int32_t> seq = prompt;
  const std::unique_ptr<InferenceState> state = model.make_state(1, context);
  std::vector<Scalar> row(static_cast<size_t>(V));  // the last position's logits, (V)
  ModelInputs inputs;
  const auto feed = [&](std::vector<int32_t>::const_iterator begin, bool restart) {
    const auto t = static_cast<int64_t>(seq.cend() - begin);
    const IndexTensor ids({1, t}, std::vector<int32_t>(begin, seq.cend()));
    inputs.clear();
    if (hooks.model) hooks.model->sample_inputs(ids, restart, inputs);
    ModelContext ctx;
    ctx.state = state.get();
    ctx.inputs = inputs.empty() ? nullptr : &inputs;
    if (mixer == nullptr) {
      const Tensor logits = model.forward(ids, ctx).value();  // (1, t, V)
      std::copy_n(logits.data() + (t - 1) * V, V, row.begin());
      return;
    }
    ctx.features = true;
    const Var features = model.forward(ids, ctx);  // (1, t, C)
    const Tensor f = features.value();
    const int64_t C = f.dim(2);
    const Tensor logits = model.logits_from_features(features).value();  // (1, t, V), as forward() computes them
    std::copy_n(logits.data() + (t - 1) * V, V, row.begin());
    mixer->mix(f.data() + (t - 1) * C, C, row.data(), V);
  };
  const auto last = [&](int64_t n) { return seq.end() - std::min<int64_t>(n, static_cast<int64_t>(seq.size())); };
  // A model with memories reads the whole prompt, segment by segment, as it trained.
  feed(state->segments() ? seq.cbegin() : last(context), true);
  for (int64_t n = 0; n < opt.tokens; ++n) {
    const int32_t next = sample_token(row.data(), V, opt, rng);
    seq.push_back(next);
    if (on_token) on_token(next);
    if (n + 1 == opt.tokens) break;
    if (limit < 0 || state->segments() || state->length() < limit) {
      feed(seq.end() - 1, false);  // one more position
    } else {
      state->reset();  // the table is full: read the last window afresh
      feed(last(context), true);
    }
  }
  return seq;
}

}  // namespace tapeformer
