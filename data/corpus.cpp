#include "tapeformer/core/program_name.h"
#include "tapeformer/data/corpus.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"

namespace tapeformer {
namespace {

std::string origin_of(const std::string& path) { return "data file '" + path + "'"; }

// A corpus is held in memory as text and again as 32-bit token ids.
constexpr size_t kMaxCorpusBytes = size_t{1} << 31;

[[noreturn]] void binary_file(const std::string& path, size_t nul) {
  fail(origin_of(path), " looks binary (NUL byte at offset ", nul, "), not text");
}

// The non-empty contents of a regular file, read in chunks so that a binary
// file is refused as soon as it shows: at the first NUL byte when
// `text_only`, at kMaxCorpusBytes otherwise.
std::string read_nonempty_file(const std::string& path, bool text_only) {
  namespace fs = std::filesystem;
  const std::string origin = origin_of(path);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) fail(origin, ": cannot open (no such file)");
  if (ec) fail(origin, ": cannot open (", ec.message(), ")");
  if (fs::is_directory(status)) fail(origin, " is a directory, not a text file");
  check_regular_file(path, "data file");

  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) fail(origin, ": cannot open (", std::strerror(errno), ")");
  std::string text;
  char chunk[1 << 16];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof chunk, file.get())) > 0) {
    if (text_only) {
      const void* nul = std::memchr(chunk, '\0', got);
      if (nul) binary_file(path, text.size() + static_cast<size_t>(static_cast<const char*>(nul) - chunk));
    }
    if (text.size() + got > kMaxCorpusBytes)
      fail(origin, " is larger than ", kMaxCorpusBytes >> 30, " GiB, the most tapeformer reads into memory; ",
           prepare_advice(path));
    text.append(chunk, got);
  }
  if (std::ferror(file.get())) fail(origin, ": cannot read (", std::strerror(errno), ")");
  if (text.empty()) fail(origin, " is empty");
  return text;
}

}  // namespace

std::string prepare_advice(const std::string& path) {
  return "write it as token files with '" + program_name() + " prepare --data " + path +
         " --out DIR' and train on DIR (token files are read window by window, never held in memory)";
}

std::string read_text_file(const std::string& path) { return read_nonempty_file(path, true); }

std::string read_corpus_file(const std::string& path, const std::string& tokenizer_kind) {
  const bool text_only = tokenizer_kinds().get(tokenizer_kind).text;
  std::string text = read_nonempty_file(path, text_only);
  if (!text_only) return text;
  const size_t bad = utf8_error_offset(text);
  if (bad != std::string::npos)
    fail(origin_of(path), " is not valid UTF-8 (bad byte ", hex_byte(static_cast<unsigned char>(text[bad])),
         " at offset ", bad, "); the byte tokenizer accepts arbitrary bytes");
  text.erase(0, utf8_bom_length(text));
  if (text.empty()) fail(origin_of(path), " holds only a byte order mark");
  return text;
}

size_t split_offset(std::string_view text, double val_fraction, bool characters, const std::string& origin) {
  TAPEFORMER_CHECK(val_fraction > 0 && val_fraction < 1, "TextCorpus: val_fraction must be in (0, 1), got ",
                   val_fraction);
  const auto n = characters ? static_cast<size_t>(count_characters(text)) : text.size();
  const auto n_train = static_cast<size_t>(static_cast<double>(n) * (1.0 - val_fraction));
  const char* unit = characters ? "characters" : "bytes";
  TAPEFORMER_CHECK(n_train > 0 && n_train < n, origin, " has ", n, " ", unit, ": too few to split at val_fraction ",
                   val_fraction, " (train would get ", n_train, ", val ", n - n_train, "; both need at least 1)");
  return characters ? character_offset(text, static_cast<int64_t>(n_train)) : n_train;
}

TextCorpus::TextCorpus(std::string_view text, const Tokenizer& tok, double val_fraction,
                       const std::string& origin) {
  const size_t at = split_offset(text, val_fraction, tokenizer_kinds().get(tok.kind()).text, origin);
  try {
    train_ = tok.encode(text.substr(0, at));
  } catch (const Error& e) {
    fail(origin, ": ", e.what());
  }
  try {
    val_ = tok.encode(text.substr(at));
  } catch (const Error& e) {
    fail(origin, ", val split from byte ", at, ": ", e.what());
  }
  TAPEFORMER_CHECK(!train_.empty() && !val_.empty(), origin, ": the ", train_.empty() ? "train" : "val",
                   " split encodes to no tokens");
  val_characters_ = count_characters(text.substr(at));
}

TextCorpus TextCorpus::from_file(const std::string& path, const Tokenizer& tok, double val_fraction) {
  return TextCorpus(read_corpus_file(path, tok.kind()), tok, val_fraction, origin_of(path));
}

LoadedCorpus load_corpus(const std::string& path, const TokenizerOptions& tokenizer, double val_fraction) {
  const std::string text = read_corpus_file(path, tokenizer.kind);
  const std::string origin = origin_of(path);
  const size_t at = split_offset(text, val_fraction, tokenizer_kinds().get(tokenizer.kind).text, origin);
  std::unique_ptr<Tokenizer> tok =
      build_tokenizer(tokenizer, CorpusText::of(text, std::string_view(text).substr(0, at), origin));
  TextCorpus corpus(text, *tok, val_fraction, origin);
  return {std::move(tok), std::move(corpus)};
}

LoadedCorpus load_corpus(const std::string& path, const std::string& kind, double val_fraction) {
  TokenizerOptions options;
  options.kind = kind;
  return load_corpus(path, options, val_fraction);
}

}  // namespace tapeformer
