// Reading a text through a model the way `eval` does, for the Evaluator
// (train/evaluator.h), which `eval`, `knn build` and SPALM's retrieval share.
//
//   EvalText text = read_eval_text("val.txt", *tokenizer, "all", 0.1);
//   for_each_window(text.ids, /*T=*/64, model.memory_use().ext_len, [&](const Window& w) {
//     Var logits = model.forward(w.ids, rng);        // (1, again + len, V)
//     ... cross_entropy(logits, w.targets) ...
//   });
//
// Windows are consecutive runs of T tokens: every token after the first is
// predicted exactly once. A model with a segment memory reads them as one
// stream (the caller carries the SegmentMemory from window to window); with
// ext_len e each window also starts with the e tokens before it again, their
// targets ignored (kIgnoreTarget).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tapeformer/core/tensor.h"
#include "tapeformer/data/tokenizer.h"

namespace tapeformer {

struct EvalText {
  std::vector<int32_t> ids;  // the text's tokens
  int64_t characters = 0;    // its characters (count_characters), for bits per character
  // Where it was read from: the file, the split ("all", "train", "val") and
  // the val fraction the split was cut with.
  std::string path, split;
  double val_fraction = 0;
  // Windows start only at multiples of it (data.align: one fixed-length
  // record per window, as the run trained and validated); 1: anywhere.
  int64_t align = 1;
};

// The tokens of a text file, whole (split "all") or the part a run with
// data.val_fraction = val_fraction trained on ("train") or validated on
// ("val"); Error naming the file (missing, binary, not UTF-8, outside the
// vocabulary, fewer than 2 tokens) or the split.
EvalText read_eval_text(const std::string& path, const Tokenizer& tokenizer, const std::string& split,
                        double val_fraction);

struct Window {
  IndexTensor ids;      // (1, again + len)
  IndexTensor targets;  // (1, again + len): the next tokens, kIgnoreTarget at the re-fed positions
  int64_t again = 0;    // re-fed positions at the front
  int64_t len = 0;      // positions predicted (after the re-fed ones)
  int64_t start = 0;    // where in the text the predicted positions start
};

// Windows of T tokens and the token after each, one every `stride` tokens
// from the first, in a text of n tokens (0 when none fits).
int64_t whole_windows(int64_t n, int64_t T, int64_t stride);
// The windows for_each_window calls fn with, for a text of n tokens.
int64_t count_windows(int64_t n, int64_t T, int64_t align = 1);

// Calls fn for each window of at most T tokens over ids, in order. With
// align a > 1, the windows training draws from (data.align: fixed-length
// records): whole windows of T starting at 0, a, 2a, ..., each once; ext_len
// must then be 0.
void for_each_window(const std::vector<int32_t>& ids, int64_t T, int64_t ext_len,
                     const std::function<void(const Window&)>& fn, int64_t align = 1);

}  // namespace tapeformer
