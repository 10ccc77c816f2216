// Text corpora: read a file once, encode it once, split it into train / val.
//
//   LoadedCorpus data = load_corpus("input.txt", "char", /*val_fraction=*/0.1);
//   data.tokenizer->vocab_size();   // 65 for tiny Shakespeare
//   data.corpus.train();            // first 90% of the token ids, data.corpus.val() the rest
//
// Step by step (when the tokenizer comes from a checkpoint, say):
//   TextCorpus corpus = TextCorpus::from_file("input.txt", *tok, 0.1);
//   TextCorpus small("hello world", *tok, 0.1);      // in memory, for tests
//
// The split is made on the text, before encoding: train = its first
// int(n * (1 - val_fraction)) characters (bytes for a tokenizer that reads
// bytes), val = the rest, each encoded on its own. For the char and byte
// tokenizers, one id per character (byte), that is exactly nanoGPT's
// prepare.py for shakespeare_char, ids[:int(n * 0.9)] (1 - 0.1 is exactly
// the double 0.9, so the sizes match Python's for every n); a subword
// vocabulary is then learnt from the train text alone. Every error is one
// line that names the file or the `origin` given for in-memory text.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tapeformer/data/tokenizer.h"

namespace tapeformer {

// The bytes of a file that is meant to be text: throws Error naming the path
// when it is missing, unreadable, a directory, empty, or "looks binary" (has
// a NUL byte). UTF-8 is not checked here (CharTokenizer checks it).
std::string read_text_file(const std::string& path);

// The bytes of a corpus for a tokenizer of `tokenizer_kind`:
//   one that reads text (char, sentencepiece): as read_text_file, and the
//           file must be valid UTF-8 (the error names the offset of the first
//           bad byte); a byte order mark at its start is dropped;
//   "byte": any non-empty file (NUL bytes and invalid UTF-8 included).
// Throws Error for a kind not in tokenizer_kinds().
std::string read_corpus_file(const std::string& path, const std::string& tokenizer_kind);

// Advice for a text corpus too large to hold in memory: the `tapeformer
// prepare` command that writes it as token files, which training reads
// window by window.
std::string prepare_advice(const std::string& path);

// Where the val split starts in text, in bytes: after int(n * (1 - val_fraction))
// of its n characters (`characters`) or bytes. Error naming `origin` unless
// 0 < val_fraction < 1 and both splits get at least one.
size_t split_offset(std::string_view text, double val_fraction, bool characters, const std::string& origin = "text");

class TextCorpus {
 public:
  // Encodes text with tok and splits it (see the top of this header).
  // Throws Error unless 0 < val_fraction < 1 and both splits are non-empty;
  // encoding errors are prefixed with `origin`.
  TextCorpus(std::string_view text, const Tokenizer& tok, double val_fraction, const std::string& origin = "text");
  // Reads path with read_corpus_file(path, tok.kind()), then as above.
  static TextCorpus from_file(const std::string& path, const Tokenizer& tok, double val_fraction);

  const std::vector<int32_t>& train() const { return train_; }
  const std::vector<int32_t>& val() const { return val_; }
  int64_t num_tokens() const { return static_cast<int64_t>(train_.size() + val_.size()); }
  // Characters of the val text (count_characters): bits per character =
  // loss per token / ln 2 * val().size() / val_characters().
  int64_t val_characters() const { return val_characters_; }

 private:
  std::vector<int32_t> train_, val_;
  int64_t val_characters_ = 0;
};

// A fresh run's data: the file, a tokenizer built for it (a char vocabulary
// is the file's distinct characters; a subword one is learnt from the train
// split) and the split corpus.
struct LoadedCorpus {
  std::unique_ptr<Tokenizer> tokenizer;
  TextCorpus corpus;
};
LoadedCorpus load_corpus(const std::string& path, const TokenizerOptions& tokenizer, double val_fraction);
// The same for a kind that takes no options (char, byte).
LoadedCorpus load_corpus(const std::string& path, const std::string& kind, double val_fraction);

}  // namespace tapeformer
