// Tokenizers: text <-> token ids, behind one interface.
//
//   CharTokenizer tok(corpus_text);                 // vocabulary = sorted distinct code points
//   std::vector<int32_t> ids = tok.encode("ROMEO:");
//   std::string text = tok.decode(ids);
//
//   ar(tok.state());                                 // into a cereal binary archive (versioned)
//   TokenizerState s;  ar(s);
//   std::unique_ptr<Tokenizer> back = make_tokenizer(s);
//
//   std::string bytes = save_tokenizer(tok);         // the same, as a self-contained blob
//   std::unique_ptr<Tokenizer> again = load_tokenizer(bytes);
//
// CharTokenizer works on Unicode code points (like Python str in nanoGPT's
// shakespeare_char), decoded from strict UTF-8 (data/utf8.h); ids are the
// ranks of the code points in sorted order, so the same corpus always gives
// the same vocabulary. ByteTokenizer maps the 256 raw bytes to ids 0..255 and
// accepts any input. Encoding a character outside the vocabulary throws an
// Error naming it, its U+ code and its byte offset:
//   character 'z' (U+007A) at byte offset 2 is not in the vocabulary (3 characters)
#pragma once

#include <array>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/serialize.h"
#include "data/utf8.h"

namespace tapeformer {

// Any tokenizer as plain data: what checkpoints store. Serialises with a
// cereal binary archive as (format version, kind, vocab); loading a different
// version throws Error instead of misreading the fields after it, and counts
// beyond what a tokenizer can have (a kind name over 16 bytes, more entries
// than Unicode has scalar values) are refused before anything is allocated.
struct TokenizerState {
  static constexpr uint32_t kVersion = 1;
  static constexpr uint64_t kMaxKindBytes = 16;
  static constexpr uint64_t kMaxVocab = 0x110000 - 0x800;  // Unicode scalar values
  std::string kind;             // "char" | "byte"
  std::vector<uint32_t> vocab;  // char: id -> code point (sorted); byte: empty

  template <class Archive>
  void save(Archive& ar) const {
    ar(kVersion, kind, vocab);
  }
  template <class Archive>
  void load(Archive& ar) {
    uint32_t version = 0;
    ar(version);
    TAPEFORMER_CHECK(version == kVersion, "tokenizer state: format version ", version,
                     " is not supported (this build reads version ", kVersion, ")");
    read_bounded(ar, kind, kMaxKindBytes, "tokenizer state: kind name");
    read_bounded(ar, vocab, kMaxVocab, "tokenizer state: vocabulary");
  }
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  // "char" | "byte"
  virtual int64_t vocab_size() const = 0;
  // Ids in [0, vocab_size()). Throws Error for text the tokenizer cannot represent.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Inverse of encode; throws Error for an id outside [0, vocab_size()).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // make_tokenizer(state()) rebuilds an identical tokenizer.
  virtual TokenizerState state() const = 0;
};

class CharTokenizer : public Tokenizer {
 public:
  // Vocabulary from a corpus, which must be non-empty valid UTF-8; `origin`
  // names the corpus in errors ("data file 'input.txt' is not valid UTF-8 ...").
  explicit CharTokenizer(std::string_view corpus, const std::string& origin = "text");
  // Vocabulary given as sorted, distinct Unicode scalar values.
  explicit CharTokenizer(std::vector<uint32_t> vocab);

  std::string kind() const override { return "char"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.size()); }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  TokenizerState state() const override { return {kind(), vocab_}; }
  const std::vector<uint32_t>& vocab() const { return vocab_; }

 private:
  void index_ascii();
  std::vector<uint32_t> vocab_;          // id -> code point, sorted
  std::array<int32_t, 128> ascii_id_{};  // code point -> id for ASCII, -1 when absent
};

class ByteTokenizer : public Tokenizer {
 public:
  std::string kind() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  TokenizerState state() const override { return {kind(), {}}; }
};

// "char" or "byte"; a char tokenizer takes its vocabulary from `corpus`
// (`origin` names it in errors). Throws Error for any other kind.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, std::string_view corpus,
                                          const std::string& origin = "text");
// Rebuilds a tokenizer from its state; throws Error for an unknown kind or a
// char vocabulary that is empty, unsorted, repeated or not Unicode.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerState& state);

// The state in a cereal binary blob, for storing as one field of a checkpoint.
// load_tokenizer throws Error "tokenizer: cannot decode (...)" for a bad blob.
std::string save_tokenizer(const Tokenizer& tok);
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& bytes);

}  // namespace tapeformer
