// Strict UTF-8: decoding, validation and encoding of Unicode code points.
//
//   size_t bad = utf8_error_offset(text);            // npos when valid
//   std::vector<size_t> at;
//   std::vector<uint32_t> cps = utf8_decode(text, &at);  // code points + byte offsets
//   std::string s;  utf8_append(s, 0x4E16);          // "世"
//
// "Strict" means exactly the well-formed sequences of Unicode 15, table 3-7:
// overlong forms (C0 AF for '/'), UTF-16 surrogates (U+D800..U+DFFF), code
// points above U+10FFFF, truncated sequences, stray continuation bytes and the
// bytes F5..FF are all rejected. The offset reported is that of the first byte
// of the offending sequence.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tapeformer {

// Decodes the sequence starting at text[offset] into *code_point and returns
// its length in bytes (1..4), or 0 when it is not well-formed UTF-8.
// Contract: offset < text.size().
size_t utf8_decode_one(std::string_view text, size_t offset, uint32_t* code_point);

// Byte offset of the first ill-formed sequence, or std::string_view::npos.
size_t utf8_error_offset(std::string_view text);

// Code points of text and, optionally, the byte offset where each starts.
// Throws Error "invalid UTF-8 at byte offset N (byte 0xXX)" on ill-formed input.
std::vector<uint32_t> utf8_decode(std::string_view text, std::vector<size_t>* offsets = nullptr);

// Appends the UTF-8 encoding of code_point (must be a Unicode scalar value:
// <= U+10FFFF and not a surrogate; throws Error otherwise).
void utf8_append(std::string& out, uint32_t code_point);

// Characters in text: the bytes that start a UTF-8 sequence (not 10xxxxxx).
// For valid UTF-8 that is its number of code points; for other bytes a count
// that still never exceeds their number.
int64_t count_characters(std::string_view text);
// Bytes at the end of text that start a sequence still missing bytes
// (E2 98 of E2 98 83): 0..3. Text read in chunks carries them to the next.
size_t utf8_incomplete_tail(std::string_view text);

// 3 when text starts with a UTF-8 byte order mark (EF BB BF, U+FEFF), else 0.
// Text corpora drop it: editors add it to mark the encoding, it is no
// character of the text.
size_t utf8_bom_length(std::string_view text);

// The byte offset where character number `n` (0-based, as count_characters
// counts them) starts; text.size() when there are not more than n.
size_t character_offset(std::string_view text, int64_t n);

// text with every ill-formed sequence replaced by U+FFFD (EF BF BD), one per
// maximal subpart (Unicode's recommended practice, chapter 3, "U+FFFD
// Substitution of Maximal Subparts", which Python's decode(errors="replace")
// follows): E2 82 (truncated) gives one U+FFFD, C0 AF (overlong) two,
// ED A0 80 (a surrogate) three. Valid text comes back unchanged.
std::string utf8_replace_invalid(std::string_view text);

// True for code points that are Unicode scalar values (encodable in UTF-8).
inline bool is_scalar_value(uint32_t cp) { return cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF); }

// How a code point is named in error messages: "'é' (U+00E9)" for printable
// characters, "'\n' (U+000A)" for common escapes, "U+0001" for other controls.
std::string describe_code_point(uint32_t code_point);

// "0xE9": one byte in hex, for error messages.
std::string hex_byte(unsigned char byte);

}  // namespace tapeformer
