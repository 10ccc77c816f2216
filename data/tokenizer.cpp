#include "data/tokenizer.h"

#include <algorithm>
#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <cstdio>
#include <set>
#include <sstream>

#include "core/error.h"

namespace tapeformer {
namespace {

constexpr uint32_t kTokenizerFormat = 1;

// Length of the UTF-8 sequence at text[i] and its code point; 0 when invalid.
size_t decode_one(std::string_view text, size_t i, uint32_t* cp) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return *cp = b0, 1;
  size_t len;
  uint32_t min, v;
  if ((b0 & 0xE0) == 0xC0) len = 2, min = 0x80, v = b0 & 0x1F;
  else if ((b0 & 0xF0) == 0xE0) len = 3, min = 0x800, v = b0 & 0x0F;
  else if ((b0 & 0xF8) == 0xF0) len = 4, min = 0x10000, v = b0 & 0x07;
  else return 0;  // continuation byte or 0xF8..0xFF
  if (i + len > text.size()) return 0;  // truncated
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (byte(i + k) & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;  // overlong, range, surrogate
  *cp = v;
  return len;
}

std::string describe(uint32_t cp) {
  std::string shown;
  if (cp >= 0x20 && cp != 0x7F) utf8_append(shown, cp);
  else if (cp == '\n') shown = "\\n";
  else if (cp == '\t') shown = "\\t";
  char code[16];
  std::snprintf(code, sizeof code, "U+%04X", cp);
  return shown.empty() ? std::string(code) : "'" + shown + "' (" + code + ")";
}

}  // namespace

size_t utf8_error_offset(std::string_view text) {
  uint32_t cp;
  for (size_t i = 0; i < text.size();) {
    const size_t n = decode_one(text, i, &cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::vector<uint32_t> utf8_decode(std::string_view text, std::vector<size_t>* offsets) {
  std::vector<uint32_t> out;
  uint32_t cp;
  for (size_t i = 0; i < text.size();) {
    const size_t n = decode_one(text, i, &cp);
    TAPEFORMER_CHECK(n != 0, "invalid UTF-8 at byte offset ", i);
    out.push_back(cp);
    if (offsets) offsets->push_back(i);
    i += n;
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

CharTokenizer::CharTokenizer(std::string_view corpus, const std::string& origin) {
  const size_t bad = utf8_error_offset(corpus);
  if (bad != std::string_view::npos) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned char>(corpus[bad]));
    fail(origin, " is not valid UTF-8 (bad byte ", hex, " at offset ", bad,
         "); use the byte tokenizer (data.tokenizer = \"byte\") for arbitrary bytes");
  }
  const std::vector<uint32_t> cps = utf8_decode(corpus);
  const std::set<uint32_t> distinct(cps.begin(), cps.end());
  vocab_.assign(distinct.begin(), distinct.end());
  TAPEFORMER_CHECK(!vocab_.empty(), origin, " is empty: no characters to build a vocabulary from");
}

CharTokenizer::CharTokenizer(std::vector<uint32_t> vocab) : vocab_(std::move(vocab)) {
  TAPEFORMER_CHECK(!vocab_.empty(), "CharTokenizer: empty vocabulary");
  for (size_t i = 1; i < vocab_.size(); ++i)
    TAPEFORMER_CHECK(vocab_[i - 1] < vocab_[i], "CharTokenizer: vocabulary must be sorted and distinct");
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  const size_t bad = utf8_error_offset(text);
  TAPEFORMER_CHECK(bad == std::string_view::npos, "text is not valid UTF-8 (bad byte at offset ", bad, ")");
  std::vector<size_t> offsets;
  const std::vector<uint32_t> cps = utf8_decode(text, &offsets);
  std::vector<int32_t> ids(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) {
    auto it = std::lower_bound(vocab_.begin(), vocab_.end(), cps[i]);
    TAPEFORMER_CHECK(it != vocab_.end() && *it == cps[i], "character ", describe(cps[i]), " at byte offset ",
                     offsets[i], " is not in the vocabulary (", vocab_.size(), " characters)");
    ids[i] = static_cast<int32_t>(it - vocab_.begin());
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    TAPEFORMER_CHECK(id >= 0 && id < vocab_size(), "decode: token ", id, " is outside the vocabulary of ",
                     vocab_size());
    utf8_append(out, vocab_[id]);
  }
  return out;
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    TAPEFORMER_CHECK(id >= 0 && id < 256, "decode: token ", id, " is not a byte");
    out += static_cast<char>(id);
  }
  return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, std::string_view corpus,
                                          const std::string& origin) {
  if (kind == "char") return std::make_unique<CharTokenizer>(corpus, origin);
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  fail("unknown tokenizer '", kind, "' (expected \"char\" or \"byte\")");
}

std::string save_tokenizer(const Tokenizer& tok) {
  std::ostringstream out;
  {
    cereal::BinaryOutputArchive ar(out);
    std::vector<uint32_t> vocab;
    if (auto* c = dynamic_cast<const CharTokenizer*>(&tok)) vocab = c->vocab();
    ar(kTokenizerFormat, tok.kind(), vocab);
  }
  return out.str();
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& bytes) {
  uint32_t format = 0;
  std::string kind;
  std::vector<uint32_t> vocab;
  try {
    std::istringstream in(bytes);
    cereal::BinaryInputArchive ar(in);
    ar(format, kind, vocab);
  } catch (const std::exception& e) {
    fail("tokenizer: cannot decode (", e.what(), ")");
  }
  TAPEFORMER_CHECK(format == kTokenizerFormat, "tokenizer: format ", format, " is not supported");
  if (kind == "char") return std::make_unique<CharTokenizer>(std::move(vocab));
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  fail("tokenizer: unknown kind '", kind, "'");
}

}  // namespace tapeformer
