// Tokenizers: text <-> token ids, behind one interface, and the table of
// kinds a config names (`data.tokenizer`).
//
//   CharTokenizer tok(corpus_text);                 // vocabulary = sorted distinct code points
//   std::vector<int32_t> ids = tok.encode("ROMEO:");
//   std::string text = tok.decode(ids);
//
//   TokenizerOptions o;  o.kind = "sentencepiece";  o.vocab_size = 1000;
//   auto sp = build_tokenizer(o, CorpusText::of(text, train_part, "data file 'input.txt'"));
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
// Subword tokenizers live in data/sentencepiece.h (SentencePiece BPE / unigram)
// and data/byte_bpe.h (GPT-2's byte-level BPE).
#pragma once

#include <array>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/core/registry.h"
#include "tapeformer/core/serialize.h"
#include "tapeformer/data/utf8.h"

namespace tapeformer {

// Any tokenizer as plain data: what checkpoints store. Serialises with a
// cereal binary archive as (format version, kind, vocab[, model]); loading an
// unknown version throws Error instead of misreading the fields after it, and
// counts beyond what a tokenizer can have (a kind name over 16 bytes, more
// entries than Unicode has scalar values, a model over 64 MiB) are refused
// before anything is allocated. Version 1 (no model) is still written for
// tokenizers without a model, so their checkpoints read in older builds too.
struct TokenizerState {
  static constexpr uint32_t kVersion = 2;
  static constexpr uint64_t kMaxKindBytes = 16;
  static constexpr uint64_t kMaxVocab = 0x110000 - 0x800;  // Unicode scalar values
  static constexpr uint64_t kMaxModelBytes = uint64_t{64} << 20;
  std::string kind;             // a name in tokenizer_kinds(): "char" | "byte" | "sentencepiece" | "byte_bpe"
  std::vector<uint32_t> vocab;  // char: id -> code point (sorted); others: empty
  std::string model;            // sentencepiece: the serialised model proto; others: empty

  template <class Archive>
  void save(Archive& ar) const {
    if (model.empty()) {
      ar(uint32_t{1}, kind, vocab);
    } else {
      ar(kVersion, kind, vocab, model);
    }
  }
  template <class Archive>
  void load(Archive& ar) {
    uint32_t version = 0;
    ar(version);
    TAPEFORMER_CHECK(version == 1 || version == kVersion, "tokenizer state: format version ", version,
                     " is not supported (this build reads versions 1 and ", kVersion, ")");
    read_bounded(ar, kind, kMaxKindBytes, "tokenizer state: kind name");
    read_bounded(ar, vocab, kMaxVocab, "tokenizer state: vocabulary");
    model.clear();
    if (version >= 2) read_bounded(ar, model, kMaxModelBytes, "tokenizer state: model");
  }
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  // its name in tokenizer_kinds()
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
  TokenizerState state() const override { return {kind(), vocab_, {}}; }
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
  TokenizerState state() const override { return {kind(), {}, {}}; }
};

// ---- the table of kinds ------------------------------------------------------

// How a run gets its tokenizer: the data.* fields a kind reads.
struct TokenizerOptions {
  std::string kind = "char";    // data.tokenizer
  int64_t vocab_size = 0;       // data.vocab_size: sentencepiece's vocabulary (0: unset)
  std::string sp_type = "bpe";  // data.sp_type: sentencepiece's algorithm, "bpe" | "unigram"
  std::string sp_model;         // data.sp_model: an existing sentencepiece .model file (then nothing is learnt)
  std::string path;             // data.tokenizer_path: files a kind reads its vocabulary from (byte_bpe)
};

// A corpus as a kind sees it when it builds its vocabulary. Each visitor calls
// f on consecutive chunks of its text, in order; a chunk ends on a line end
// where the text has one within 16 MiB, else on a whole UTF-8 sequence.
// The strings the visitors read must outlive them.
using TextChunks = std::function<void(const std::function<void(std::string_view)>&)>;
struct CorpusText {
  TextChunks all;      // the whole text (a char vocabulary covers the val split too, as nanoGPT's does)
  TextChunks train;    // the training split only (what a learnt subword vocabulary may see)
  std::string origin;  // names the text in errors: "data file 'input.txt'"
  // Both visitors over text held in memory, one chunk each.
  static CorpusText of(std::string_view all, std::string_view train, std::string origin = "text");
};

struct TokenizerKind {
  std::string name;
  std::string summary;  // one line, for docs
  bool text = true;     // reads valid UTF-8 and splits corpora by characters; false: any bytes, split by bytes
  // Error naming the data.* field when `options` asks for something the kind does not do.
  std::function<void(const TokenizerOptions&)> check;
  // A new tokenizer for a corpus (options already checked).
  std::function<std::unique_ptr<Tokenizer>(const TokenizerOptions&, const CorpusText&)> build;
  // The tokenizer a state() describes; Error for a state it cannot be.
  std::function<std::unique_ptr<Tokenizer>(const TokenizerState&)> restore;
};

// Built in: "char", "byte", "sentencepiece", "byte_bpe". Key: data.tokenizer.
Registry<TokenizerKind>& tokenizer_kinds();

// check + build, by options.kind; Error for an unknown kind.
std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& options, const CorpusText& corpus);
// A kind that takes no options from a config (char, byte) with its vocabulary
// from `corpus` (`origin` names it in errors).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, std::string_view corpus,
                                          const std::string& origin = "text");
// Rebuilds a tokenizer from its state; throws Error for an unknown kind or a
// state the kind refuses (a char vocabulary that is empty, unsorted, repeated
// or not Unicode; an unreadable model).
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerState& state);

// The state in a cereal binary blob, for storing as one field of a checkpoint.
// load_tokenizer throws Error "tokenizer: cannot decode (...)" for a bad blob.
std::string save_tokenizer(const Tokenizer& tok);
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& bytes);

// Generated ids to printable text, one id at a time: an id that decodes to
// part of a UTF-8 character (a byte token, a byte-fallback piece) is held
// until the character is whole, so a stream never prints half of one.
//
//   StreamDecoder out(tok);
//   for (int32_t id : generated) std::fputs(out.push(id).c_str(), stdout);
//   std::fputs(out.flush().c_str(), stdout);
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(&tok) {}
  std::string push(int32_t id);  // text that is now whole ("" while a character is incomplete)
  std::string flush();           // whatever is held, as the tokenizer decodes it

 private:
  const Tokenizer* tok_;
  std::vector<int32_t> held_;
};

}  // namespace tapeformer
