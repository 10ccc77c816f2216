// The data of a training run, loaded from what data.path names: a text file
// (tokenized in memory; the tokenizer learnt from its train split unless one
// is given) or a directory of token files (`tapeformer prepare`'s
// train.bin, val.bin and tokenizer.bin, or nanoGPT's with meta.pkl), read
// window by window and never whole.
//
//   TrainingData d = load_training_data("input.txt", {"char"}, /*val_fraction=*/0.1, /*vocab_size=*/0, nullptr);
//   RandomWindowSampler batches(*d.train, B, T, seed, "train split");
//
// Errors name the file or directory and what is wrong with it (missing
// splits, a tokenizer of another kind or size, ids beyond the vocabulary).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tapeformer/data/corpus.h"
#include "tapeformer/data/token_file.h"
#include "tapeformer/data/tokenizer.h"

namespace tapeformer {

struct TrainingData {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<TextCorpus> corpus;  // a text file's ids, in memory; null with token files
  std::unique_ptr<TokenSource> train, val;  // the splits the samplers read
  double val_tokens_per_char = 1;           // turns nats per token into bits per character
};

// A text file is held in memory, as text and as token ids; when that runs
// out of memory the Error says so and points at token files (`tapeformer
// prepare`), which are read window by window.
// `options` are data.tokenizer and its settings, `val_fraction` data.val_fraction,
// `vocab_size` data.vocab_size (0: any, for token files). `tok`, when given
// (a resumed run's), is used instead of building or reading one.
TrainingData load_training_data(const std::string& path, const TokenizerOptions& options, double val_fraction,
                                int64_t vocab_size, std::unique_ptr<Tokenizer> tok);

}  // namespace tapeformer
