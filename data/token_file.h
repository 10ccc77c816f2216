// Token sources, and nanoGPT's token files.
//
// A TokenSource is what the batch samplers read windows from: the token ids
// of a corpus in memory (VectorTokens), or a file of uint16 ids as nanoGPT's
// prepare.py writes them (TokenFile, train.bin / val.bin), read window by
// window with pread so that a corpus larger than memory trains with bounded
// memory (the page cache holds what the kernel likes; the process holds one
// batch).
//
//   prepare_token_files("input.txt", "data/shakespeare", {"char"}, 0.1);   // train.bin, val.bin, tokenizer.bin
//   TokenFile train("data/shakespeare/train.bin");
//   RandomWindowSampler s(train, 12, 64, seed, "train split");
//
// prepare_token_files streams the text in 16 MiB chunks that end on line
// ends (counting, then building the vocabulary, then encoding), so its memory
// does not grow with the file (a subword vocabulary is learnt from at most a
// million lines); the split is TextCorpus's (for char: nanoGPT's, train =
// the first int(n (1 - val_fraction)) ids) and the result equals TextCorpus
// on the same text id for id. tokenizer.bin is the tokenizer
// (save_tokenizer), which sample and eval need to read and write text.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tapeformer/data/tokenizer.h"

namespace tapeformer {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t size() const = 0;
  // ids [start, start + n) into out; Error when outside [0, size()).
  virtual void read(int64_t start, int64_t n, int32_t* out) const = 0;
};

// Ids in memory (not owned: the vector must outlive this).
class VectorTokens : public TokenSource {
 public:
  explicit VectorTokens(const std::vector<int32_t>& ids) : ids_(&ids) {}
  int64_t size() const override { return static_cast<int64_t>(ids_->size()); }
  void read(int64_t start, int64_t n, int32_t* out) const override;

 private:
  const std::vector<int32_t>* ids_;
};

// A file of little-endian uint16 ids (nanoGPT's train.bin / val.bin).
class TokenFile : public TokenSource {
 public:
  // Error naming the path when it is missing, empty or of odd length.
  explicit TokenFile(const std::string& path);
  ~TokenFile() override;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  int64_t size() const override { return size_; }
  void read(int64_t start, int64_t n, int32_t* out) const override;
  // The largest id in the file (one pass, for checking against a vocabulary).
  int32_t max_id() const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// The characters (count_characters) that ids decode to, decoded in chunks of
// a million: with the ids' count, what turns nats per token into bits per character.
int64_t count_characters(const TokenSource& ids, const Tokenizer& tok);

struct PreparedFiles {
  int64_t train_tokens = 0, val_tokens = 0, vocab_size = 0;
};

// `progress(stage, bytes done, bytes total)`, stage "count" | "vocabulary" | "encode".
using PrepareProgress = std::function<void(const char*, int64_t, int64_t)>;

// Writes out_dir/train.bin, val.bin and tokenizer.bin from a text file,
// with a tokenizer built as the options say. Error for a vocabulary over
// 65536 ids (uint16), and as read_corpus_file for bad files.
PreparedFiles prepare_token_files(const std::string& text_path, const std::string& out_dir,
                                  const TokenizerOptions& tokenizer, double val_fraction,
                                  const PrepareProgress& progress = {});

}  // namespace tapeformer
