// Text corpora: read a file, encode it once, split train/val.
//
//   std::string text = read_text_file("input.txt");   // clear errors for bad files
//   auto tok = make_tokenizer("char", text, "'input.txt'");
//   TextCorpus corpus(text, *tok, /*val_fraction=*/0.1, "'input.txt'");
//   corpus.train();   // first 90% of the tokens (nanoGPT's split), corpus.val() the rest
#pragma once

#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace tapeformer {

// The file's bytes. Throws Error naming the path when it is missing,
// unreadable, a directory, empty, or binary (contains a NUL byte).
std::string read_text_file(const std::string& path);

class TextCorpus {
 public:
  // Encodes text with tok and splits at floor(n * (1 - val_fraction)).
  TextCorpus(const std::string& text, const Tokenizer& tok, double val_fraction, const std::string& origin);
  const std::vector<int32_t>& train() const { return train_; }
  const std::vector<int32_t>& val() const { return val_; }

 private:
  std::vector<int32_t> train_, val_;
};

}  // namespace tapeformer
