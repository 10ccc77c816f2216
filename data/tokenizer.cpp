#include "data/tokenizer.h"

#include <algorithm>
#include <set>

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

// ---- factories and persistence ------------------------------------------------

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, std::string_view corpus,
                                          const std::string& origin) {
  if (kind == "char") return std::make_unique<CharTokenizer>(corpus, origin);
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  fail("unknown tokenizer '", kind, "' (expected \"char\" or \"byte\")");
}

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerState& state) {
  if (state.kind == "char") return std::make_unique<CharTokenizer>(state.vocab);
  if (state.kind == "byte") {
    TAPEFORMER_CHECK(state.vocab.empty(), "tokenizer: a byte tokenizer has no stored vocabulary, got ",
                     state.vocab.size(), " entries");
    return std::make_unique<ByteTokenizer>();
  }
  fail("tokenizer: unknown kind '", state.kind, "' (expected \"char\" or \"byte\")");
}

std::string save_tokenizer(const Tokenizer& tok) { return to_bytes(tok.state()); }

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& bytes) {
  TokenizerState state;
  from_bytes(bytes, state, "tokenizer: cannot decode");
  return make_tokenizer(state);
}

}  // namespace tapeformer
