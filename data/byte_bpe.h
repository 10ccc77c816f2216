// Byte-level BPE: GPT-2's tokenizer (Radford et al. 2019, "Language Models
// are Unsupervised Multitask Learners", §2.2), read from the files Hugging
// Face's GPT2Tokenizer and GPT2TokenizerFast write, with their ids.
//
//   auto tok = ByteBpeTokenizer::read("gpt2");       // vocab.json + merges.txt, or tokenizer.json
//   std::vector<int32_t> ids = tok->encode("Hello world");   // {15496, 995} with GPT-2's files
//   std::string text = tok->decode(ids);
//
// Encoding, in transformers' order:
//   1. ill-formed UTF-8 becomes U+FFFD, one per maximal subpart
//      (utf8_replace_invalid), as a Python str made with errors="replace";
//   2. added tokens ("<|endoftext|>") are cut out wherever they occur (the
//      leftmost, then the longest) and become their own ids;
//   3. the rest is split by GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (contractions; letters, digits or other symbols, each with the space
//      before them; white space, all but its last character when a word
//      follows), with a space put first when add_prefix_space is set;
//   4. each piece's UTF-8 bytes are written in a 256-symbol alphabet (byte b
//      is the character b when printable, else U+0100 + n in byte order) and
//      the merges join adjacent symbols, the lowest rank first, every
//      occurrence left to right, until no pair has a rank.
// Decoding maps the symbols back to bytes and replaces what is not UTF-8.
//
// The split runs on PCRE2 (Debian's libpcre2-dev) with Unicode properties:
// \p{L} and \p{N} over the whole of Unicode need its tables.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tapeformer/data/tokenizer.h"

namespace tapeformer {

struct ByteBpeModel {
  std::vector<std::string> tokens;                          // id -> token, in the byte alphabet
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<std::pair<int32_t, std::string>> added;       // id, text matched as is ("<|endoftext|>")
  bool add_prefix_space = false;
  bool ignore_merges = false;  // a piece that is a whole token is that token
};

class ByteBpeTokenizer : public Tokenizer {
 public:
  // Checks the model: ids 0..n-1 each once, every byte symbol a token, each
  // merge's halves and result tokens, added tokens' ids within the table.
  // `origin` names the files in errors.
  ByteBpeTokenizer(ByteBpeModel model, const std::string& origin);
  ~ByteBpeTokenizer() override;

  // From a directory holding tokenizer.json, or vocab.json and merges.txt
  // (tokenizer.json first when both are there), or from a tokenizer.json
  // file itself. Error naming the file and the field for anything else:
  // another model type than BPE, another pre-tokenizer than ByteLevel, a
  // file that is not JSON or too large.
  static std::unique_ptr<ByteBpeTokenizer> read(const std::string& path);
  // tokenizer.json's text; vocab.json's and merges.txt's.
  static std::unique_ptr<ByteBpeTokenizer> from_tokenizer_json(std::string_view text, const std::string& origin);
  static std::unique_ptr<ByteBpeTokenizer> from_vocab_merges(std::string_view vocab_json, std::string_view merges_txt,
                                                             const std::string& origin);

  std::string kind() const override { return "byte_bpe"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(model_.tokens.size()); }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  // state().model is a tokenizer.json that from_tokenizer_json reads back.
  TokenizerState state() const override;

  const ByteBpeModel& model() const { return model_; }
  // The files transformers' GPT2Tokenizer reads: vocab.json and merges.txt.
  std::string vocab_json() const;
  std::string merges_txt() const;
  // tokenizer.json as the tokenizers library writes it for GPT-2.
  std::string tokenizer_json() const;

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& out,
                    std::unordered_map<std::string, std::vector<int32_t>>& cache) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;

  ByteBpeModel model_;
  std::unordered_map<std::string, int32_t> ids_;  // token -> id
  std::vector<int32_t> byte_ids_;                 // byte -> the id of its one-symbol token
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left id, right id) -> (rank, merged id)
  std::vector<int16_t> byte_of_symbol_;  // code point (< 0x144) -> byte, -1 outside the alphabet
  std::vector<bool> is_added_;           // id -> whether it is an added token
};

// The table entry (tokenizer_kinds() lists it): data.tokenizer "byte_bpe" with
// data.tokenizer_path.
TokenizerKind byte_bpe_kind();

}  // namespace tapeformer
