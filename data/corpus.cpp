#include "data/corpus.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace tapeformer {

std::string read_text_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  TAPEFORMER_CHECK(fs::exists(path, ec), "data file '", path, "': cannot open (no such file)");
  TAPEFORMER_CHECK(!fs::is_directory(path, ec), "data file '", path, "' is a directory, not a text file");
  std::ifstream in(path, std::ios::binary);
  TAPEFORMER_CHECK(in.good(), "data file '", path, "': cannot open (", std::strerror(errno), ")");
  std::ostringstream buf;
  buf << in.rdbuf();
  std::string text = buf.str();
  TAPEFORMER_CHECK(!text.empty(), "data file '", path, "' is empty");
  const size_t nul = text.find('\0');
  TAPEFORMER_CHECK(nul == std::string::npos, "data file '", path, "' looks binary (NUL byte at offset ", nul,
                   "), not text");
  return text;
}

TextCorpus::TextCorpus(const std::string& text, const Tokenizer& tok, double val_fraction,
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
  const size_t split = static_cast<size_t>(static_cast<double>(n) * (1.0 - val_fraction));
  TAPEFORMER_CHECK(split > 0 && split < n, origin, " has ", n, " tokens: too few to split ", 1 - val_fraction,
                   " / ", val_fraction, " into train and validation");
  train_.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(split));
  val_.assign(ids.begin() + static_cast<std::ptrdiff_t>(split), ids.end());
}

}  // namespace tapeformer
