#include "tapeformer/data/tokenizer.h"

#include <algorithm>
#include <set>

#include "tapeformer/data/byte_bpe.h"
#include "tapeformer/data/sentencepiece.h"

namespace tapeformer {
namespace {

// `hint` ends the message: a corpus can switch tokenizers, a prompt cannot.
void check_utf8(std::string_view text, const std::string& origin, const char* hint = "") {
  const size_t bad = utf8_error_offset(text);
  if (bad == std::string_view::npos) return;
  fail(origin, " is not valid UTF-8 (bad byte ", hex_byte(static_cast<unsigned char>(text[bad])), " at offset ",
       bad, ")", hint);
}

}  // namespace

// ---- CharTokenizer ------------------------------------------------------------

CharTokenizer::CharTokenizer(std::string_view corpus, const std::string& origin) {
  check_utf8(corpus, origin, "; the byte tokenizer accepts arbitrary bytes");
  TAPEFORMER_CHECK(!corpus.empty(), origin, " is empty: no characters to build a vocabulary from");
  const std::vector<uint32_t> cps = utf8_decode(corpus);
  const std::set<uint32_t> distinct(cps.begin(), cps.end());  // sorted: ids do not depend on text order
  vocab_.assign(distinct.begin(), distinct.end());
  index_ascii();
}

CharTokenizer::CharTokenizer(std::vector<uint32_t> vocab) : vocab_(std::move(vocab)) {
  TAPEFORMER_CHECK(!vocab_.empty(), "CharTokenizer: empty vocabulary");
  for (size_t i = 0; i < vocab_.size(); ++i) {
    TAPEFORMER_CHECK(is_scalar_value(vocab_[i]), "CharTokenizer: vocabulary entry ", i, " (",
                     describe_code_point(vocab_[i]), ") is not a Unicode scalar value");
    TAPEFORMER_CHECK(i == 0 || vocab_[i - 1] < vocab_[i], "CharTokenizer: vocabulary must be sorted and distinct (entry ",
                     i, " ", describe_code_point(vocab_[i]), " follows ", describe_code_point(vocab_[i - 1]), ")");
  }
  index_ascii();
}

// Plain-ASCII corpora (Shakespeare) then encode with one table lookup per byte.
void CharTokenizer::index_ascii() {
  ascii_id_.fill(-1);
  for (size_t id = 0; id < vocab_.size() && vocab_[id] < 128; ++id) ascii_id_[vocab_[id]] = static_cast<int32_t>(id);
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  uint32_t cp = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_decode_one(text, i, &cp);
    if (n == 0) check_utf8(text, "text");  // throws with the offending byte
    int32_t id = -1;
    if (cp < 128) {
      id = ascii_id_[cp];
    } else {
      const auto it = std::lower_bound(vocab_.begin(), vocab_.end(), cp);
      if (it != vocab_.end() && *it == cp) id = static_cast<int32_t>(it - vocab_.begin());
    }
    TAPEFORMER_CHECK(id >= 0, "character ", describe_code_point(cp), " at byte offset ", i,
                     " is not in the vocabulary (", vocab_.size(), " characters)");
    ids.push_back(id);
    i += n;
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    TAPEFORMER_CHECK(id >= 0 && id < vocab_size(), "decode: token ", id, " is outside the vocabulary of ",
                     vocab_size());
    utf8_append(out, vocab_[id]);
  }
  return out;
}

// ---- ByteTokenizer ------------------------------------------------------------

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    TAPEFORMER_CHECK(ids[i] >= 0 && ids[i] < 256, "decode: token ", ids[i], " is not a byte (0..255)");
    out[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
  }
  return out;
}

// ---- the table of kinds ------------------------------------------------------

CorpusText CorpusText::of(std::string_view all, std::string_view train, std::string origin) {
  return {[all](const std::function<void(std::string_view)>& f) { f(all); },
          [train](const std::function<void(std::string_view)>& f) { f(train); }, std::move(origin)};
}

namespace {

// char and byte take nothing but the corpus: the subword fields must be unset.
void check_no_subword_options(const TokenizerOptions& o) {
  const std::string why = "\" takes its vocabulary from the corpus (only \"sentencepiece\" reads ";
  TAPEFORMER_CHECK(o.vocab_size == 0, "data.vocab_size is ", o.vocab_size, " but data.tokenizer \"", o.kind, why,
                   "data.vocab_size)");
  TAPEFORMER_CHECK(o.sp_model.empty(), "data.sp_model is set but data.tokenizer \"", o.kind, why, "data.sp_model)");
  TAPEFORMER_CHECK(o.path.empty(), "data.tokenizer_path is set but data.tokenizer \"", o.kind,
                   "\" takes its vocabulary from the corpus (only \"byte_bpe\" reads data.tokenizer_path)");
}

TokenizerKind char_kind() {
  return {"char", "Unicode code points; vocabulary = the corpus's distinct characters (nanoGPT's shakespeare_char)",
          true, check_no_subword_options,
          [](const TokenizerOptions&, const CorpusText& corpus) -> std::unique_ptr<Tokenizer> {
            std::set<uint32_t> seen;
            bool any = false;
            corpus.all([&](std::string_view chunk) {
              for (size_t i = 0; i < chunk.size();) {
                uint32_t cp = 0;
                const size_t n = utf8_decode_one(chunk, i, &cp);
                if (n == 0) check_utf8(chunk, corpus.origin);  // throws with the offending byte
                seen.insert(cp);
                i += n;
              }
              any = any || !chunk.empty();
            });
            TAPEFORMER_CHECK(any, corpus.origin, " is empty: no characters to build a vocabulary from");
            return std::make_unique<CharTokenizer>(std::vector<uint32_t>(seen.begin(), seen.end()));
          },
          [](const TokenizerState& s) -> std::unique_ptr<Tokenizer> {
            TAPEFORMER_CHECK(s.model.empty(), "tokenizer: a char tokenizer has no model, got ", s.model.size(), " bytes");
            return std::make_unique<CharTokenizer>(s.vocab);
          }};
}

TokenizerKind byte_kind() {
  return {"byte", "the 256 byte values; takes any file", false, check_no_subword_options,
          [](const TokenizerOptions&, const CorpusText&) -> std::unique_ptr<Tokenizer> {
            return std::make_unique<ByteTokenizer>();
          },
          [](const TokenizerState& s) -> std::unique_ptr<Tokenizer> {
            TAPEFORMER_CHECK(s.vocab.empty() && s.model.empty(),
                             "tokenizer: a byte tokenizer has no stored vocabulary or model, got ", s.vocab.size(),
                             " entries and ", s.model.size(), " bytes");
            return std::make_unique<ByteTokenizer>();
          }};
}

}  // namespace

Registry<TokenizerKind>& tokenizer_kinds() {
  static Registry<TokenizerKind> r("data.tokenizer", {char_kind(), byte_kind(), sentencepiece_kind(), byte_bpe_kind()});
  return r;
}

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& options, const CorpusText& corpus) {
  const TokenizerKind& kind = tokenizer_kinds().get(options.kind);
  if (kind.check) kind.check(options);
  return kind.build(options, corpus);
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, std::string_view corpus,
                                          const std::string& origin) {
  const TokenizerKind& k = tokenizer_kinds().get(kind);
  if (k.text) {
    const size_t bad = utf8_error_offset(corpus);
    if (bad != std::string_view::npos)
      fail(origin, " is not valid UTF-8 (bad byte ", hex_byte(static_cast<unsigned char>(corpus[bad])), " at offset ",
           bad, "); the byte tokenizer accepts arbitrary bytes");
  }
  TokenizerOptions options;
  options.kind = kind;
  return build_tokenizer(options, CorpusText::of(corpus, corpus, origin));
}

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerState& state) {
  const TokenizerKind* kind = tokenizer_kinds().find(state.kind);
  if (kind == nullptr) fail("tokenizer: unknown kind '", state.kind, "' (known: ", tokenizer_kinds().names(), ")");
  return kind->restore(state);
}

std::string save_tokenizer(const Tokenizer& tok) { return to_bytes(tok.state()); }

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& bytes) {
  TokenizerState state;
  from_bytes(bytes, state, "tokenizer: cannot decode");
  return make_tokenizer(state);
}

// ---- StreamDecoder --------------------------------------------------------------

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD, what a decoder prints for a broken sequence
constexpr size_t kMaxHeld = 4;                               // a UTF-8 character has at most 4 bytes

// True when text is valid UTF-8 but for a sequence cut short at its end:
// more bytes may still complete it.
bool ends_mid_character(std::string_view text) {
  const size_t tail = utf8_incomplete_tail(text);
  return tail > 0 && utf8_error_offset(text) == text.size() - tail;
}

}  // namespace

std::string StreamDecoder::push(int32_t id) {
  held_.push_back(id);
  std::string text = tok_->decode(held_);
  // A byte token leaves a cut sequence; a byte-fallback piece decodes to U+FFFD until its character is whole.
  const bool partial = ends_mid_character(text) || text.find(kReplacement) != std::string::npos;
  if (partial && held_.size() < kMaxHeld) return "";
  held_.clear();
  return text;
}

std::string StreamDecoder::flush() {
  std::string text = held_.empty() ? "" : tok_->decode(held_);
  held_.clear();
  return text;
}

}  // namespace tapeformer
