#include "data/corpus.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace tapeformer {
namespace {

std::string origin_of(const std::string& path) { return "data file '" + path + "'"; }

// The non-empty contents of a regular (or special, e.g. a pipe) file.
std::string read_nonempty_file(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string origin = origin_of(path);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) fail(origin, ": cannot open (no such file)");
  if (ec) fail(origin, ": cannot open (", ec.message(), ")");
  if (fs::is_directory(status)) fail(origin, " is a directory, not a text file");

  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) fail(origin, ": cannot open (", std::strerror(errno), ")");
  std::string text;
  char chunk[1 << 16];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof chunk, file)) > 0) text.append(chunk, got);
  const bool read_failed = std::ferror(file) != 0;
  const int read_errno = errno;
  std::fclose(file);
  if (read_failed) fail(origin, ": cannot read (", std::strerror(read_errno), ")");
  if (text.empty()) fail(origin, " is empty");
  return text;
}

void check_no_nul(const std::string& text, const std::string& path) {
  const size_t nul = text.find('\0');
  if (nul == std::string::npos) return;
  fail(origin_of(path), " looks binary (NUL byte at offset ", nul, "), not text");
}

}  // namespace

std::string read_text_file(const std::string& path) {
  std::string text = read_nonempty_file(path);
  check_no_nul(text, path);
  return text;
}

std::string read_corpus_file(const std::string& path, const std::string& tokenizer_kind) {
  TAPEFORMER_CHECK(tokenizer_kind == "char" || tokenizer_kind == "byte", "unknown tokenizer '",
                   tokenizer_kind, "' (expected \"char\" or \"byte\")");
  std::string text = read_nonempty_file(path);
  if (tokenizer_kind == "byte") return text;
  check_no_nul(text, path);
  const size_t bad = utf8_error_offset(text);
  if (bad != std::string::npos)
    fail(origin_of(path), " is not valid UTF-8 (bad byte ", hex_byte(static_cast<unsigned char>(text[bad])),
         " at offset ", bad, "); the byte tokenizer accepts arbitrary bytes");
  return text;
}

TextCorpus::TextCorpus(std::string_view text, const Tokenizer& tok, double val_fraction,
                       const std::string& origin) {
  TAPEFORMER_CHECK(val_fraction > 0 && val_fraction < 1, "TextCorpus: val_fraction must be in (0, 1), got ",
                   val_fraction);
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text);
  } catch (const Error& e) {
    fail(origin, ": ", e.what());
  }
  const size_t n = ids.size();
  const auto n_train = static_cast<size_t>(static_cast<double>(n) * (1.0 - val_fraction));
  TAPEFORMER_CHECK(n_train > 0 && n_train < n, origin, " has ", n, " tokens: too few to split at val_fraction ",
                   val_fraction, " (train would get ", n_train, ", val ", n - n_train, "; both need at least 1)");
  train_.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n_train));
  val_.assign(ids.begin() + static_cast<std::ptrdiff_t>(n_train), ids.end());
}

TextCorpus TextCorpus::from_file(const std::string& path, const Tokenizer& tok, double val_fraction) {
  return TextCorpus(read_corpus_file(path, tok.kind()), tok, val_fraction, origin_of(path));
}

LoadedCorpus load_corpus(const std::string& path, const std::string& kind, double val_fraction) {
  const std::string text = read_corpus_file(path, kind);
  std::unique_ptr<Tokenizer> tok = make_tokenizer(kind, text, origin_of(path));
  TextCorpus corpus(text, *tok, val_fraction, origin_of(path));
  return {std::move(tok), std::move(corpus)};
}

}  // namespace tapeformer
