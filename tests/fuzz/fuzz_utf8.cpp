// Fuzz target: strict UTF-8 (data/utf8.h) and the char tokenizer.
// - utf8_error_offset agrees with an independent validator written from the
//   byte ranges of Unicode table 3-7 (the library checks decoded values instead);
// - valid text decodes and re-encodes to itself, a CharTokenizer built on it
//   encodes and decodes it back, and a tokenizer with another vocabulary
//   (a prompt's case) encodes it exactly or refuses it with Error;
// - invalid text is refused with tapeformer::Error, by the decoder and by the
//   tokenizer, and everything before the reported offset is valid.
#include <string>
#include <string_view>
#include <vector>

#include "tapeformer/data/tokenizer.h"
#include "tapeformer/data/utf8.h"
#include "fuzz.h"

namespace {

// Offset of the first ill-formed sequence by table 3-7's lead/second-byte
// ranges, or npos.
size_t table_error_offset(std::string_view s) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  for (size_t i = 0; i < s.size();) {
    const unsigned b = at(i);
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b <= 0x7F) len = 1;
    else if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b == 0xE0) len = 3, lo = 0xA0;
    else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) len = 3;
    else if (b == 0xED) len = 3, hi = 0x9F;
    else if (b == 0xF0) len = 4, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) len = 4;
    else if (b == 0xF4) len = 4, hi = 0x8F;
    else return i;
    if (s.size() - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      const unsigned c = at(i + k);
      const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

// A vocabulary the fuzzed text did not come from, as a prompt meets it.
const tapeformer::CharTokenizer& fixed_tokenizer() {
  static const tapeformer::CharTokenizer tok("ROMEO:\nh\u00e9llo \u4e16\u754c!");
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tapeformer;
  using fuzz::require;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t bad = utf8_error_offset(text);
  require(bad == table_error_offset(text), "utf8_error_offset differs from table 3-7");

  if (bad == std::string_view::npos) {
    std::vector<size_t> offsets;
    const std::vector<uint32_t> cps = utf8_decode(text, &offsets);
    std::string again;
    for (size_t i = 0; i < cps.size(); ++i) {
      require(offsets[i] == again.size(), "decode offset is not where the code point starts");
      utf8_append(again, cps[i]);
    }
    require(again == text, "decode then encode does not give the text back");
    if (!text.empty()) {
      const CharTokenizer tok(text);
      const std::vector<int32_t> ids = tok.encode(text);
      require(ids.size() == cps.size(), "one id per code point");
      require(tok.decode(ids) == text, "tokenizer round trip");
      const CharTokenizer rebuilt(tok.vocab());
      require(rebuilt.encode(text) == ids, "tokenizer rebuilt from its vocabulary encodes the same");
    }
    // A prompt against a vocabulary it did not come from: encoded exactly, or refused.
    std::vector<int32_t> ids;
    if (fuzz::refused_or_done([&] { ids = fixed_tokenizer().encode(text); }))
      require(fixed_tokenizer().decode(ids) == text, "a prompt encoded without error decodes to itself");
  } else {
    require(bad < text.size(), "error offset inside the text");
    require(utf8_error_offset(std::string_view(text).substr(0, bad)) == std::string_view::npos,
            "text before the error offset is valid");
    require(!fuzz::refused_or_done([&] { utf8_decode(text); }), "utf8_decode accepts invalid text");
    require(!fuzz::refused_or_done([&] { CharTokenizer tok(text); }), "CharTokenizer accepts invalid text");
    require(!fuzz::refused_or_done([&] { fixed_tokenizer().encode(text); }), "encode accepts invalid text");
  }
  return 0;
}
