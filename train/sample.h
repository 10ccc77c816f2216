// Sampling from a trained TransformerLM.
//
//   SampleOptions opt;  opt.tokens = 200;  opt.temperature = 0.8f;  opt.top_k = 40;
//   Rng rng(opt.seed);
//   std::vector<int32_t> out = generate(model, prompt_ids, opt, rng);   // prompt + new tokens
//
// Each step draws the next token from the model's logits for the last
// block_size tokens (read through the KV caches: one new position per token
// while the text fits in the block, the whole last block once it does not),
// from softmax(logits / temperature), restricted to the k most likely
// tokens (top_k > 0) and to the smallest set whose probability reaches top_p
// (top_p < 1). temperature 0 picks the most likely token.
#pragma once

#include <functional>
#include <vector>

#include "layers/transformer.h"

namespace tapeformer {

struct SampleOptions {
  int64_t tokens = 200;      // new tokens to generate
  float temperature = 1.0f;  // >= 0; 0 = greedy
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // in (0, 1]; 1 = off
  uint64_t seed = 0;
  void validate() const;
};

// Picks a token from one row of logits (V).
int32_t sample_token(const Scalar* logits, int64_t V, const SampleOptions& opt, Rng& rng);

// Returns prompt followed by opt.tokens sampled tokens. `on_token`, when set,
// is called with each new token as it is produced (for streaming output).
std::vector<int32_t> generate(TransformerLM& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt, Rng& rng,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace tapeformer
