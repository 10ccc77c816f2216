#include "tapeformer/data/utf8.h"

#include <cstdio>

#include "tapeformer/core/error.h"

namespace tapeformer {
namespace {

std::string code_point_code(uint32_t cp) {
  char code[16];
  std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(cp));
  return code;
}

}  // namespace

size_t utf8_decode_one(std::string_view text, size_t i, uint32_t* cp) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return *cp = b0, 1;
  size_t len;
  uint32_t min, v;
  if ((b0 & 0xE0) == 0xC0) len = 2, min = 0x80, v = b0 & 0x1F;
  else if ((b0 & 0xF0) == 0xE0) len = 3, min = 0x800, v = b0 & 0x0F;
  else if ((b0 & 0xF8) == 0xF0) len = 4, min = 0x10000, v = b0 & 0x07;
  else return 0;  // a continuation byte where a sequence should start, or F8..FF
  if (len > text.size() - i) return 0;  // truncated by the end of the text
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;  // truncated by a non-continuation byte
    v = (v << 6) | (byte(i + k) & 0x3F);
  }
  // Checking the decoded value (rather than the lead byte ranges of table 3-7)
  // rejects the same sequences: overlongs decode below `min`, F4 90.. and
  // F5..F7 decode above U+10FFFF, ED A0..ED BF decode to surrogates.
  if (v < min || !is_scalar_value(v)) return 0;
  *cp = v;
  return len;
}

std::string utf8_replace_invalid(std::string_view text) {
  if (utf8_error_offset(text) == std::string_view::npos) return std::string(text);
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  std::string out;
  out.reserve(text.size() + 8);
  uint32_t cp;
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_decode_one(text, i, &cp);
    if (n != 0) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    // The maximal subpart: the lead byte and the continuation bytes that
    // table 3-7 allows after it, as far as they go (at least the one byte).
    const unsigned char b0 = byte(i);
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (b0 >= 0xC2 && b0 <= 0xDF) len = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) len = 3, lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    else if (b0 >= 0xF0 && b0 <= 0xF4) len = 4, lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;
    while (k < len && i + k < text.size()) {
      const unsigned char b = byte(i + k);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
      ++k;
    }
    out.append("\xEF\xBF\xBD");
    i += k;
  }
  return out;
}

size_t utf8_error_offset(std::string_view text) {
  uint32_t cp;
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_decode_one(text, i, &cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::vector<uint32_t> utf8_decode(std::string_view text, std::vector<size_t>* offsets) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  uint32_t cp;
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_decode_one(text, i, &cp);
    TAPEFORMER_CHECK(n != 0, "invalid UTF-8 at byte offset ", i, " (byte ",
                     hex_byte(static_cast<unsigned char>(text[i])), ")");
    out.push_back(cp);
    if (offsets) offsets->push_back(i);
    i += n;
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  TAPEFORMER_CHECK(is_scalar_value(cp), "utf8_append: ", code_point_code(cp), " is not a Unicode scalar value");
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

std::string describe_code_point(uint32_t cp) {
  const std::string code = code_point_code(cp);
  std::string shown;
  if (cp == '\n') shown = "\\n";
  else if (cp == '\t') shown = "\\t";
  else if (cp == '\r') shown = "\\r";
  // C0 controls, DEL and C1 controls would garble the message; name them by code only.
  else if (cp >= 0x20 && !(cp >= 0x7F && cp <= 0x9F) && is_scalar_value(cp)) utf8_append(shown, cp);
  return shown.empty() ? code : "'" + shown + "' (" + code + ")";
}

std::string hex_byte(unsigned char byte) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(byte));
  return hex;
}

size_t utf8_incomplete_tail(std::string_view text) {
  for (size_t back = 1; back <= 3 && back <= text.size(); ++back) {
    const auto c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back for its lead
    const size_t len = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    return len > back ? back : 0;
  }
  return 0;
}

size_t utf8_bom_length(std::string_view text) { return text.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0; }

size_t character_offset(std::string_view text, int64_t n) {
  size_t at = 0;
  for (int64_t seen = 0; at < text.size(); ++at) {
    if ((static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) continue;
    if (seen++ == n) break;
  }
  return at;
}

int64_t count_characters(std::string_view text) {
  int64_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace tapeformer
