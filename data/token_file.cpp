#include "tapeformer/data/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/data/utf8.h"

namespace tapeformer {
namespace fs = std::filesystem;

void VectorTokens::read(int64_t start, int64_t n, int32_t* out) const {
  TAPEFORMER_CHECK(start >= 0 && n >= 0 && start + n <= size(), "tokens [", start, ", ", start + n,
                   ") outside the ", size(), " ids");
  std::copy(ids_->begin() + start, ids_->begin() + start + n, out);
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  check_regular_file(path, "token file");
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

int64_t count_characters(const TokenSource& ids, const Tokenizer& tok) {
  int64_t n = 0;
  std::vector<int32_t> chunk;
  for (int64_t at = 0; at < ids.size(); at += 1 << 20) {
    chunk.resize(static_cast<size_t>(std::min<int64_t>(1 << 20, ids.size() - at)));
    ids.read(at, static_cast<int64_t>(chunk.size()), chunk.data());
    n += count_characters(tok.decode(chunk));
  }
  return n;
}

namespace {

constexpr size_t kChunk = 16 << 20;

// Calls f(chunk) for consecutive chunks of the file. With `utf8`, each ends
// on its last line end, or, in a chunk without one, on a whole UTF-8
// sequence (the rest is carried into the next chunk), and a byte order mark
// at the start of the file is dropped (as read_corpus_file does);
// `progress(stage, ...)` after each.
template <class F>
void for_each_chunk(const std::string& path, bool utf8, const char* stage, const PrepareProgress& progress, F&& f) {
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
    if (utf8 && done == static_cast<int64_t>(buf.size())) buf.erase(0, utf8_bom_length(buf));  // the first chunk
    std::string text = carry + buf;
    carry.clear();
    if (utf8 && !last) {
      size_t cut = text.rfind('\n');
      if (cut != std::string::npos) {
        cut += 1;
      } else {  // keep an incomplete sequence at the end for the next chunk
        cut = text.size() - utf8_incomplete_tail(text);
      }
      carry = text.substr(cut);
      text.resize(cut);
    }
    f(std::string_view(text));
    if (progress) progress(stage, done, total);
    if (last) break;
  }
  TAPEFORMER_CHECK(carry.empty(), "data file '", path, "' ends inside a UTF-8 sequence");
}

void write_ids(std::ofstream& out, const std::vector<int32_t>& ids) {
  const std::vector<uint16_t> buf(ids.begin(), ids.end());
  out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size() * 2));
}

}  // namespace

PreparedFiles prepare_token_files(const std::string& text_path, const std::string& out_dir,
                                  const TokenizerOptions& options, double val_fraction,
                                  const PrepareProgress& progress) {
  TAPEFORMER_CHECK(val_fraction > 0 && val_fraction < 1, "prepare: val fraction must be in (0, 1), got ", val_fraction);
  const TokenizerKind& kind = tokenizer_kinds().get(options.kind);
  if (kind.check) kind.check(options);
  check_regular_file(text_path, "data file");
  TAPEFORMER_CHECK(fs::is_regular_file(text_path), "data file '", text_path, "': not found (or not a file)");
  const bool chars = kind.text;
  const std::string origin = "data file '" + text_path + "'";
  // Pass 1: check the text and count its characters (bytes), for the split.
  int64_t n = 0, offset = 0;
  for_each_chunk(text_path, chars, "count", progress, [&](std::string_view text) {
    if (chars) {
      const size_t bad = utf8_error_offset(text);
      TAPEFORMER_CHECK(bad == std::string_view::npos, origin, " is not valid UTF-8 (bad byte at offset ",
                       offset + static_cast<int64_t>(bad), ")");
      n += count_characters(text);
    } else {
      n += static_cast<int64_t>(text.size());
    }
    offset += static_cast<int64_t>(text.size());
  });
  TAPEFORMER_CHECK(n >= 2, origin, " holds fewer than 2 ", chars ? "characters" : "bytes");
  const auto split = static_cast<int64_t>(static_cast<double>(n) * (1.0 - val_fraction));  // nanoGPT's int(n * 0.9)
  TAPEFORMER_CHECK(split >= 1 && split < n, "prepare: ", n, " ", chars ? "characters" : "bytes",
                   " leave an empty split at val fraction ", val_fraction);
  // Calls f(train part, val part) for each chunk, cut at the split.
  const auto for_each_part = [&](const char* stage, auto&& f) {
    int64_t before = 0;  // units in earlier chunks
    for_each_chunk(text_path, chars, stage, progress, [&](std::string_view text) {
      const int64_t units = chars ? count_characters(text) : static_cast<int64_t>(text.size());
      const int64_t in_train = std::clamp<int64_t>(split - before, 0, units);
      const size_t cut = in_train == units ? text.size()
                         : chars         ? character_offset(text, in_train)
                                         : static_cast<size_t>(in_train);
      f(text.substr(0, cut), text.substr(cut));
      before += units;
    });
  };
  // Pass 2: the vocabulary (a kind reads what it needs: char all of it, a subword kind the train split).
  const CorpusText corpus{[&](const std::function<void(std::string_view)>& f) {
                            for_each_part("vocabulary", [&](std::string_view a, std::string_view b) {
                              f(a);
                              f(b);
                            });
                          },
                          [&](const std::function<void(std::string_view)>& f) {
                            for_each_part("vocabulary", [&](std::string_view a, std::string_view) {
                              if (!a.empty()) f(a);
                            });
                          },
                          origin};
  const std::unique_ptr<Tokenizer> tok = kind.build(options, corpus);
  TAPEFORMER_CHECK(tok->vocab_size() <= 65536, "prepare: ", tok->vocab_size(), " distinct tokens do not fit in uint16 ids");
  // Pass 3: the ids, train part into train.bin, val part into val.bin.
  fs::create_directories(out_dir);
  const fs::path dir(out_dir);
  std::ofstream train((dir / "train.bin").string(), std::ios::binary), val((dir / "val.bin").string(), std::ios::binary);
  TAPEFORMER_CHECK(train.good() && val.good(), "prepare: cannot write into '", out_dir, "'");
  PreparedFiles p;
  for_each_part("encode", [&](std::string_view a, std::string_view b) {
    try {
      const std::vector<int32_t> to_train = tok->encode(a), to_val = tok->encode(b);
      write_ids(train, to_train);
      write_ids(val, to_val);
      p.train_tokens += static_cast<int64_t>(to_train.size());
      p.val_tokens += static_cast<int64_t>(to_val.size());
    } catch (const Error& e) {
      fail(origin, ": ", e.what());
    }
  });
  // A failed write (a full disk, `ulimit -f`) leaves none of the files half-written.
  const auto give_up = [&](int error) {
    train.close();
    val.close();
    std::error_code ec;
    for (const char* name : {"train.bin", "val.bin", "tokenizer.bin"}) fs::remove(dir / name, ec);
    fail("prepare: writing the token files in '", out_dir, "' failed: ", std::strerror(error != 0 ? error : EIO),
         " (no token file is left)");
  };
  train.flush();
  val.flush();
  if (!train.good() || !val.good()) give_up(errno);
  std::ofstream tokenizer_file((dir / "tokenizer.bin").string(), std::ios::binary);
  tokenizer_file << save_tokenizer(*tok);
  tokenizer_file.flush();
  if (!tokenizer_file.good()) give_up(errno);
  p.vocab_size = tok->vocab_size();
  return p;
}

}  // namespace tapeformer
