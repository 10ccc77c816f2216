#include "tapeformer/data/sentencepiece.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/data/utf8.h"

namespace tapeformer {
namespace {

constexpr size_t kMaxLines = 1000000;  // lines a vocabulary is learnt from (SentencePiece's advice)
constexpr size_t kMaxLineBytes = 4096;  // under SentencePiece's max_sentence_length (4192)
constexpr size_t kEncodeBlock = 1 << 16;  // bytes of text per parallel encoding task

// Lines for the trainer: every non-empty line of the text, cut into pieces
// of at most kMaxLineBytes on UTF-8 boundaries; past kMaxLines, a uniform
// sample of them (reservoir sampling with a fixed seed).
class LineSample : public sentencepiece::SentenceIterator {
 public:
  void add(std::string_view line) {
    while (!line.empty()) {
      size_t cut = std::min(line.size(), kMaxLineBytes);
      while (cut < line.size() && cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;
      keep(line.substr(0, cut));
      line.remove_prefix(cut);
    }
  }
  void add_text(std::string_view text) {
    for (size_t at = 0; at < text.size();) {
      const size_t end = std::min(text.find('\n', at), text.size());
      add(text.substr(at, end - at));
      at = end + 1;
    }
  }
  size_t size() const { return lines_.size(); }

  bool done() const override { return next_ >= lines_.size(); }
  void Next() override { ++next_; }
  const std::string& value() const override { return lines_[next_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void keep(std::string_view line) {
    ++seen_;
    if (lines_.size() < kMaxLines) {
      lines_.emplace_back(line);
    } else if (const uint64_t slot = rng_.below(seen_); slot < kMaxLines) {
      lines_[slot].assign(line);
    }
  }
  std::vector<std::string> lines_;
  uint64_t seen_ = 0;
  size_t next_ = 0;
  Rng rng_{0x5e47e9c3};
};

void check_sp_options(const TokenizerOptions& o) {
  TAPEFORMER_CHECK(o.sp_type == "bpe" || o.sp_type == "unigram", "data.sp_type must be \"bpe\" or \"unigram\", got \"",
                   o.sp_type, "\"");
  if (!o.sp_model.empty()) {
    TAPEFORMER_CHECK(o.vocab_size == 0, "data.vocab_size is ", o.vocab_size, " but data.sp_model '", o.sp_model,
                     "' already fixes the vocabulary: set one of them");
    return;
  }
  TAPEFORMER_CHECK(o.vocab_size >= 0 && o.vocab_size <= 65536, "data.vocab_size must be in [0, 65536] (token files hold uint16 ids), got ",
                   o.vocab_size);
}

// SentencePiece's trainer reports a failed check as "./src/FILE.cc(LINE)
// [CONDITION] text": the text, with the key to change when it is about the
// vocabulary size (the sizes it allows depend on the text).
[[noreturn]] void learning_failed(const std::string& message, const TokenizerOptions& o, const std::string& origin) {
  std::string text = message;
  const size_t bracket = text.find("] ");
  if (text.find(".cc(") != std::string::npos && bracket != std::string::npos) text = text.substr(bracket + 2);
  long long have = 0, need = 0;
  const size_t small = text.find("required_chars. ");
  if (small != std::string::npos &&
      std::sscanf(text.c_str() + small, "required_chars. %lld vs %lld", &have, &need) == 2)
    fail(origin, ": data.vocab_size = ", o.vocab_size, " is too small for this text: a sentencepiece vocabulary of it "
         "needs at least ", need, " pieces (256 bytes, <unk>, \"\\n\" and every distinct character of the training "
         "split); set data.vocab_size to ", need, " or more");
  const size_t large = text.find("set it to a value <= ");
  if (large != std::string::npos && std::sscanf(text.c_str() + large, "set it to a value <= %lld", &need) == 1)
    fail(origin, ": data.vocab_size = ", o.vocab_size, " is too large for this text: a sentencepiece ", o.sp_type,
         " vocabulary learnt from it holds at most ", need, " pieces; set data.vocab_size to ", need,
         " or less, or train on more text");
  fail(origin, ": learning a ", o.vocab_size, "-piece sentencepiece ", o.sp_type,
       " vocabulary (data.vocab_size) failed: ", text);
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(std::string model_proto, const std::string& origin)
    : proto_(std::move(model_proto)), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  TAPEFORMER_CHECK(!proto_.empty(), origin, ": an empty sentencepiece model");
  const auto status = sp_->LoadFromSerializedProto(proto_);
  TAPEFORMER_CHECK(status.ok(), origin, ": not a sentencepiece model (", status.ToString(), ")");
  TAPEFORMER_CHECK(sp_->GetPieceSize() > 0, origin, ": a sentencepiece model without pieces");
  const int nl = sp_->PieceToId("\n");
  const int nl_byte = sp_->PieceToId("<0x0A>");
  if (!sp_->IsUnknown(nl)) {
    newline_ = nl;
  } else if (sp_->IsByte(nl_byte)) {
    newline_ = nl_byte;
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::learn(const TokenizerOptions& o,
                                                                      const CorpusText& corpus) {
  // Checked here, not in check_sp_options: token files and checkpoints bring their own model.
  TAPEFORMER_CHECK(o.vocab_size > 0, "data.tokenizer \"sentencepiece\" needs data.vocab_size (e.g. 1000) to learn a "
                                     "vocabulary, or data.sp_model naming an existing .model file");
  LineSample lines;
  corpus.train([&](std::string_view chunk) { lines.add_text(chunk); });
  TAPEFORMER_CHECK(lines.size() > 0, corpus.origin, ": the training split has no text to learn a vocabulary from");
  const std::unordered_map<std::string, std::string> args{
      {"model_type", o.sp_type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"normalization_rule_name", "identity"},  // the text as it is: decode(encode(x)) == x
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"user_defined_symbols", "\n"},  // lines are learnt apart; "\n" is one piece between them
      {"byte_fallback", "true"},       // unseen characters as bytes, never <unk>
      {"character_coverage", "1.0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"input_sentence_size", "0"},  // LineSample already bounds and samples the lines
      {"num_threads", "1"},  // more threads change the vocabulary (ties): it must depend on the text only
      {"minloglevel", "2"},  // errors only: the status carries what went wrong
  };
  std::string proto;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &proto);
  if (!status.ok()) learning_failed(std::string(status.message()), o, corpus.origin);
  return std::make_unique<SentencePieceTokenizer>(std::move(proto), corpus.origin);
}

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::read(const std::string& path) {
  check_regular_file(path, "data.sp_model");
  std::ifstream in(path, std::ios::binary);
  TAPEFORMER_CHECK(in.good(), "data.sp_model '", path, "': cannot open");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return std::make_unique<SentencePieceTokenizer>(bytes.str(), "data.sp_model '" + path + "'");
}

int64_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::string SentencePieceTokenizer::piece(int32_t id) const {
  TAPEFORMER_CHECK(id >= 0 && id < vocab_size(), "piece: token ", id, " is outside the vocabulary of ", vocab_size());
  return sp_->IdToPiece(id);
}

void SentencePieceTokenizer::encode_lines(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<int> ids;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    if (end > at) {
      const auto status = sp_->Encode(text.substr(at, end - at), &ids);
      TAPEFORMER_CHECK(status.ok(), "sentencepiece: cannot encode the text at byte ", at, " (", status.ToString(), ")");
      out.insert(out.end(), ids.begin(), ids.end());
    }
    if (end < text.size() && newline_ >= 0) out.push_back(newline_);
    at = end + 1;
  }
}

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  // Blocks of whole lines, encoded in parallel and joined in order.
  std::vector<size_t> starts{0};
  while (starts.back() + kEncodeBlock < text.size()) {
    const size_t nl = text.find('\n', starts.back() + kEncodeBlock);
    if (nl == std::string_view::npos) break;
    starts.push_back(nl + 1);
  }
  starts.push_back(text.size());
  const auto blocks = static_cast<int64_t>(starts.size() - 1);
  std::vector<std::vector<int32_t>> parts(static_cast<size_t>(blocks));
  parallel::parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      encode_lines(text.substr(starts[b], starts[b + 1] - starts[b]), parts[static_cast<size_t>(b)]);
  });
  std::vector<int32_t> ids;
  for (const auto& p : parts) ids.insert(ids.end(), p.begin(), p.end());
  return ids;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  const int64_t n = vocab_size();
  for (int32_t id : ids)
    TAPEFORMER_CHECK(id >= 0 && id < n, "decode: token ", id, " is outside the vocabulary of ", n);
  std::string text;
  const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  TAPEFORMER_CHECK(status.ok(), "sentencepiece: cannot decode (", status.ToString(), ")");
  return text;
}

TokenizerKind sentencepiece_kind() {
  return {"sentencepiece",
          "SentencePiece subwords, BPE or unigram (data.sp_type), data.vocab_size pieces learnt from the "
          "training split, or data.sp_model",
          true, check_sp_options,
          [](const TokenizerOptions& o, const CorpusText& corpus) -> std::unique_ptr<Tokenizer> {
            if (!o.sp_model.empty()) return SentencePieceTokenizer::read(o.sp_model);
            return SentencePieceTokenizer::learn(o, corpus);
          },
          [](const TokenizerState& s) -> std::unique_ptr<Tokenizer> {
            TAPEFORMER_CHECK(s.vocab.empty(), "tokenizer: a sentencepiece tokenizer stores a model, not a vocabulary of ",
                             s.vocab.size(), " entries");
            return std::make_unique<SentencePieceTokenizer>(s.model, "tokenizer state");
          }};
}

}  // namespace tapeformer
