#include "data/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/utf8.h"

namespace tapeformer {
namespace fs = std::filesystem;

void VectorTokens::read(int64_t start, int64_t n, int32_t* out) const {
  TAPEFORMER_CHECK(start >= 0 && n >= 0 && start + n <= size(), "tokens [", start, ", ", start + n,
                   ") outside the ", size(), " ids");
  std::copy(ids_->begin() + start, ids_->begin() + start + n, out);
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TAPEFORMER_CHECK(fd_ >= 0, "token file '", path, "': cannot open (", std::strerror(errno), ")");
  struct stat st {};
  ::fstat(fd_, &st);
  const auto bytes = static_cast<int64_t>(st.st_size);
  if (bytes == 0 || bytes % 2 != 0) {
    ::close(fd_);
    fail("token file '", path, "': ", bytes, " bytes is not a non-empty array of uint16 ids");
  }
  size_ = bytes / 2;
}

TokenFile::~TokenFile() {
  if (fd_ >= 0) ::close(fd_);
}

void TokenFile::read(int64_t start, int64_t n, int32_t* out) const {
  TAPEFORMER_CHECK(start >= 0 && n >= 0 && start + n <= size_, "token file '", path_, "': ids [", start, ", ",
                   start + n, ") outside its ", size_);
  std::vector<uint16_t> buf(static_cast<size_t>(n));
  size_t done = 0;
  const size_t want = buf.size() * 2;
  while (done < want) {
    const ssize_t got = ::pread(fd_, reinterpret_cast<char*>(buf.data()) + done, want - done,
                                static_cast<off_t>(start * 2 + static_cast<int64_t>(done)));
    TAPEFORMER_CHECK(got > 0, "token file '", path_, "': read failed at id ", start, " (",
                     got < 0 ? std::strerror(errno) : "file shrank", ")");
    done += static_cast<size_t>(got);
  }
  for (size_t i = 0; i < buf.size(); ++i) out[i] = buf[i];  // little-endian hosts (x86, arm64)
}

int32_t TokenFile::max_id() const {
  int32_t m = 0;
  std::vector<int32_t> chunk;
  for (int64_t at = 0; at < size_; at += 1 << 20) {
    const int64_t n = std::min<int64_t>(1 << 20, size_ - at);
    chunk.resize(static_cast<size_t>(n));
    read(at, n, chunk.data());
    m = std::max(m, *std::max_element(chunk.begin(), chunk.end()));
  }
  return m;
}

namespace {

constexpr size_t kChunk = 16 << 20;

// Calls f(chunk) for consecutive chunks of the file, each ending on a whole
// UTF-8 sequence when `utf8` (the rest is carried into the next chunk).
template <class F>
void for_each_chunk(const std::string& path, bool utf8, const std::function<void(int64_t, int64_t)>& progress, F&& f) {
  std::ifstream in(path, std::ios::binary);
  TAPEFORMER_CHECK(in.good(), "data file '", path, "': cannot open");
  const auto total = static_cast<int64_t>(fs::file_size(path));
  std::string buf, carry;
  int64_t done = 0;
  while (true) {
    buf.resize(kChunk);
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    buf.resize(static_cast<size_t>(in.gcount()));
    done += static_cast<int64_t>(buf.size());
    const bool last = buf.empty() || !in;
    std::string text = carry + buf;
    carry.clear();
    if (utf8 && !last) {  // keep an incomplete sequence at the end for the next chunk
      size_t cut = text.size();
      for (size_t back = 1; back <= 3 && back <= text.size(); ++back) {
        const auto c = static_cast<unsigned char>(text[text.size() - back]);
        if ((c & 0xC0) != 0x80) {  // a lead byte (or ASCII): is its sequence complete?
          const size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
          if (len > back) cut = text.size() - back;
          break;
        }
      }
      carry = text.substr(cut);
      text.resize(cut);
    }
    f(std::string_view(text));
    if (progress) progress(done, total);
    if (last) break;
  }
  TAPEFORMER_CHECK(carry.empty(), "data file '", path, "' ends inside a UTF-8 sequence");
}

void write_ids(std::ofstream& out, const std::vector<int32_t>& ids, size_t from, size_t to) {
  std::vector<uint16_t> buf(ids.begin() + static_cast<std::ptrdiff_t>(from), ids.begin() + static_cast<std::ptrdiff_t>(to));
  out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size() * 2));
}

}  // namespace

PreparedFiles prepare_token_files(const std::string& text_path, const std::string& out_dir,
                                  const std::string& tokenizer_kind, double val_fraction,
                                  const std::function<void(int64_t, int64_t)>& progress) {
  TAPEFORMER_CHECK(val_fraction > 0 && val_fraction < 1, "prepare: val fraction must be in (0, 1), got ", val_fraction);
  TAPEFORMER_CHECK(tokenizer_kind == "char" || tokenizer_kind == "byte", "prepare: tokenizer must be \"char\" or \"byte\", got \"",
                   tokenizer_kind, "\"");
  TAPEFORMER_CHECK(fs::is_regular_file(text_path), "data file '", text_path, "': not found (or not a file)");
  const bool chars = tokenizer_kind == "char";
  // Pass 1: the vocabulary and the number of ids.
  std::set<uint32_t> seen;
  int64_t n = 0, offset = 0;
  for_each_chunk(text_path, chars, progress, [&](std::string_view text) {
    if (chars) {
      const size_t bad = utf8_error_offset(text);
      TAPEFORMER_CHECK(bad == std::string_view::npos, "data file '", text_path, "' is not valid UTF-8 (bad byte at offset ",
                       offset + static_cast<int64_t>(bad), ")");
      for (size_t i = 0; i < text.size();) {
        uint32_t cp = 0;
        i += utf8_decode_one(text, i, &cp);
        seen.insert(cp);
        ++n;
      }
    } else {
      n += static_cast<int64_t>(text.size());
    }
    offset += static_cast<int64_t>(text.size());
  });
  TAPEFORMER_CHECK(n >= 2, "data file '", text_path, "' holds fewer than 2 tokens");
  std::unique_ptr<Tokenizer> tok;
  if (chars) tok = std::make_unique<CharTokenizer>(std::vector<uint32_t>(seen.begin(), seen.end()));
  else tok = std::make_unique<ByteTokenizer>();
  TAPEFORMER_CHECK(tok->vocab_size() <= 65536, "prepare: ", tok->vocab_size(), " distinct tokens do not fit in uint16 ids");
  const auto split = static_cast<int64_t>(static_cast<double>(n) * (1.0 - val_fraction));  // nanoGPT's int(n * 0.9)
  TAPEFORMER_CHECK(split >= 1 && split < n, "prepare: ", n, " tokens leave an empty split at val fraction ", val_fraction);
  // Pass 2: the ids, into train.bin until `split`, then val.bin.
  fs::create_directories(out_dir);
  const fs::path dir(out_dir);
  std::ofstream train((dir / "train.bin").string(), std::ios::binary), val((dir / "val.bin").string(), std::ios::binary);
  TAPEFORMER_CHECK(train.good() && val.good(), "prepare: cannot write into '", out_dir, "'");
  int64_t written = 0;
  for_each_chunk(text_path, chars, progress, [&](std::string_view text) {
    const std::vector<int32_t> ids = tok->encode(text);
    const auto m = static_cast<int64_t>(ids.size());
    const int64_t to_train = std::clamp<int64_t>(split - written, 0, m);
    write_ids(train, ids, 0, static_cast<size_t>(to_train));
    write_ids(val, ids, static_cast<size_t>(to_train), ids.size());
    written += m;
  });
  TAPEFORMER_CHECK(train.good() && val.good(), "prepare: writing the token files in '", out_dir, "' failed");
  std::ofstream((dir / "tokenizer.bin").string(), std::ios::binary) << save_tokenizer(*tok);
  return {split, n - split, tok->vocab_size()};
}

}  // namespace tapeformer
