// Sampling from a trained LanguageModel.
//
//   SampleOptions opt;  opt.tokens = 200;  opt.temperature = 0.8f;  opt.top_k = 40;
//   Rng rng(opt.seed);
//   std::vector<int32_t> out = generate(model, prompt_ids, opt, rng);   // prompt + new tokens
//
// Each step feeds one new token through every layer's inference state and
// draws the next from softmax(logits / temperature), restricted to the k
// most likely tokens (top_k > 0) and to the smallest set whose probability
// reaches top_p (top_p < 1); temperature 0 picks the most likely token.
// What the model sees (`context`, default block_size):
//   - softmax layers keep the last `context` positions in their KV caches;
//     past that the oldest drop out, so a token costs O(context) however
//     long the text grows (keys keep the positions they were computed at);
//   - linear attention's running sums carry the whole text, O(1) per token;
//   - a learned position table (model.positional "learned") ends at
//     block_size: context may not exceed it, and once the text passes the
//     table the state is reset and the last `context` tokens are fed again
//     each step, exactly what a full forward of that window sees.
// Schemes without a table (sinusoidal, rope, alibi, shaw) run past
// block_size, with any context. A model with memories (model.mem_len > 0)
// reads as it trained and as `eval` reads it, whatever its positional scheme:
// the whole text in segments of block_size, its memories carried from one to
// the next (the unfinished segment is read again for each new token; context
// does not apply).
#pragma once

#include <functional>
#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/layers/transformer.h"
#include "tapeformer/train/model_hooks.h"

namespace tapeformer {

struct SampleOptions {
  int64_t tokens = 200;      // new tokens to generate
  float temperature = 1.0f;  // >= 0; 0 = greedy
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // in (0, 1]; 1 = off
  uint64_t seed = 0;
  int64_t context = 0;       // positions softmax layers keep; 0 = block_size
  void validate() const;
};

// The context a model reads with these options (opt.context, or the block
// size when 0); Error when a learned position table cannot hold it.
int64_t sample_context(const LanguageModel& model, const SampleOptions& opt);

// Thrown by sample_token (and so generate) when a logit is NaN or infinite:
// the model's weights are unusable, which the caller names.
class NonFiniteLogits : public Error {
 public:
  explicit NonFiniteLogits(const std::string& logit)
      : Error("sample: " + logit + " (the weights hold NaN or inf values)"), logit(logit) {}
  std::string logit;  // "the model's logit for token 3 is nan"
};

// Picks a token from one row of logits (V); NonFiniteLogits on a NaN or inf.
int32_t sample_token(const Scalar* logits, int64_t V, const SampleOptions& opt, Rng& rng);

// Returns prompt followed by opt.tokens sampled tokens. `on_token`, when set,
// is called with each new token as it is produced (for streaming output).
// `hooks` (train/model_hooks.h; either may be null): the model kind's,
// which give the extra inputs of every token fed (SPALM's retrieved tokens),
// and a mixture (kNN-LM's). With a mixture that mixes, the model returns its
// features and logits_from_features() the same logits, which the mixture
// rewrites before each draw.
std::vector<int32_t> generate(LanguageModel& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt, Rng& rng,
                              const std::function<void(int32_t)>& on_token = {}, ReadHooks hooks = {});

}  // namespace tapeformer
