// SentencePiece subword tokenizers (Kudo & Richardson 2018): BPE or unigram,
// learnt from a corpus's training split, or read from an existing .model file.
// Config: data.tokenizer = "sentencepiece", data.vocab_size, data.sp_type
// ("bpe" | "unigram"), data.sp_model (a .model file: nothing is learnt).
//
//   TokenizerOptions o;  o.kind = "sentencepiece";  o.vocab_size = 1000;
//   auto tok = build_tokenizer(o, CorpusText::of(text, train_part, "data file 'input.txt'"));
//   tok->encode("ROMEO:\nO, she doth");   // ids of pieces such as "RO", "ME", "O", ":", "\n", "O", ",", "▁she", ...
//
// What is learnt is chosen so that decode(encode(text)) == text for any UTF-8
// text, as with the char tokenizer: no normalisation (rule "identity"),
// spaces kept as they are (no dummy prefix, no collapsing of runs), "\n" a
// piece of its own that no other piece crosses, and byte fallback: a character
// the training split lacks is spelt as its UTF-8 bytes (<0xE2> <0x98> <0x83>),
// never as <unk>. That costs 256 + 2 ids of the vocabulary (the bytes, <unk>,
// "\n") plus one per distinct character; a smaller data.vocab_size is refused
// with SentencePiece's own message. Training sees the split's lines (at most
// a million, drawn uniformly with a fixed seed when there are more; a line
// over 4096 bytes is cut into pieces), so the result depends only on the text.
//
// A .model file from elsewhere is used as it was trained: its normaliser may
// change the text (NFKC, collapsed spaces). Text is encoded line by line, with
// a newline as the model's "\n" piece, else its <0x0A> byte piece, else
// dropped (SentencePiece's own default turns it into a space).
//
// The state (TokenizerState::model) is the serialised model proto, so a
// checkpoint needs nothing beside it. Encoding runs lines in parallel.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tapeformer/data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tapeformer {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // From a serialised model proto; `origin` names it in errors.
  SentencePieceTokenizer(std::string model_proto, const std::string& origin);
  ~SentencePieceTokenizer() override;

  // Learns a vocabulary of options.vocab_size pieces from corpus.train.
  static std::unique_ptr<SentencePieceTokenizer> learn(const TokenizerOptions& options, const CorpusText& corpus);
  // Reads a .model file; Error naming the path when it is missing or not a model.
  static std::unique_ptr<SentencePieceTokenizer> read(const std::string& path);

  std::string kind() const override { return "sentencepiece"; }
  int64_t vocab_size() const override;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  TokenizerState state() const override { return {kind(), {}, proto_}; }
  // The piece of an id: "▁the", "\n", "<0xE2>".
  std::string piece(int32_t id) const;

 private:
  void encode_lines(std::string_view text, std::vector<int32_t>& out) const;
  std::string proto_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int32_t newline_ = -1;  // the id a "\n" becomes, or -1 (dropped)
};

// The table entry (tokenizer_kinds() lists it).
TokenizerKind sentencepiece_kind();

}  // namespace tapeformer
