// Tokenizers: text <-> token ids, behind one interface.
//
//   CharTokenizer tok(corpus_text);                 // vocabulary = sorted distinct code points
//   std::vector<int32_t> ids = tok.encode("ROMEO:");
//   std::string text = tok.decode(ids);
//   std::string bytes = save_tokenizer(tok);        // stored in checkpoints
//   std::unique_ptr<Tokenizer> back = load_tokenizer(bytes);
//
// CharTokenizer works on Unicode code points (like Python str in nanoGPT),
// decoded from strict UTF-8; ByteTokenizer uses the 256 raw bytes. Encoding a
// character outside the vocabulary throws an Error naming it, its U+ code and
// its byte offset.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tapeformer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  // "char" | "byte"
  virtual int64_t vocab_size() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
};

class CharTokenizer : public Tokenizer {
 public:
  // Vocabulary from a corpus (must be valid UTF-8; `origin` names it in errors).
  explicit CharTokenizer(std::string_view corpus, const std::string& origin = "text");
  // Vocabulary given as sorted, distinct code points.
  explicit CharTokenizer(std::vector<uint32_t> vocab);
  std::string kind() const override { return "char"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.size()); }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  const std::vector<uint32_t>& vocab() const { return vocab_; }

 private:
  std::vector<uint32_t> vocab_;  // id -> code point, sorted
};

class ByteTokenizer : public Tokenizer {
 public:
  std::string kind() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
};

// "char" or "byte"; a char tokenizer takes its vocabulary from `corpus`.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, std::string_view corpus,
                                          const std::string& origin = "text");

// Versioned binary form (cereal) for checkpoints.
std::string save_tokenizer(const Tokenizer& tok);
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& bytes);

// ---- strict UTF-8 -------------------------------------------------------------
// Byte offset of the first invalid sequence (overlong, surrogate, > U+10FFFF,
// truncated, stray continuation byte), or npos when text is valid UTF-8.
size_t utf8_error_offset(std::string_view text);
// Code points of valid UTF-8 text, with the byte offset where each starts.
std::vector<uint32_t> utf8_decode(std::string_view text, std::vector<size_t>* offsets = nullptr);
void utf8_append(std::string& out, uint32_t code_point);

}  // namespace tapeformer
