#include "tapeformer/core/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "tapeformer/core/error.h"

namespace tapeformer {

void check_regular_file(const std::string& path, const std::string& what) {
  // stat, not open: opening a FIFO is what blocks.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;
  const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : nullptr;
  if (kind != nullptr) fail(what, " '", path, "' is ", kind, ", not a regular file");
}

FileSink::int_type FileSink::overflow(int_type ch) {
  if (!drain()) return traits_type::eof();
  if (!traits_type::eq_int_type(ch, traits_type::eof())) {
    *pptr() = traits_type::to_char_type(ch);
    pbump(1);
  }
  return traits_type::not_eof(ch);
}

bool FileSink::drain() {
  const char* p = pbase();
  const size_t n = static_cast<size_t>(pptr() - pbase());
  hash_ = fnv1a64(p, n, hash_);
  for (size_t done = 0; done < n && error_ == 0;) {
    const ssize_t w = ::write(fd_, p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) error_ = w == 0 ? EIO : errno;  // no progress and no error code: an I/O error
    if (w > 0) done += static_cast<size_t>(w);
  }
  count_ += n;
  setp(buf_.data(), buf_.data() + buf_.size());
  return error_ == 0;
}

namespace {

// Makes a rename durable. Best effort: some filesystems cannot open or sync
// a directory, and the file itself is already synced.
void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Writes of `path` go through ".NAME.tmp.PID" in the same directory.
struct TempName {
  std::filesystem::path dir;
  std::string prefix;  // ".NAME.tmp."
};
TempName temp_name(const std::string& path) {
  const std::filesystem::path target(path);
  return {target.has_parent_path() ? target.parent_path() : std::filesystem::path("."),
          "." + target.filename().string() + ".tmp."};
}

}  // namespace

void write_atomic(const std::string& path, const std::function<void(int fd, FileSink& sink)>& fill) {
  const TempName names = temp_name(path);
  const std::string tmp = (names.dir / (names.prefix + std::to_string(::getpid()))).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);  // less the umask
  // Messages name the file the user asked for; the temp file is ours.
  TAPEFORMER_CHECK(fd >= 0, "cannot write '", path, "': ", std::strerror(errno), " (writing its temp file '", tmp,
                   "')");
  // Any failure, including one that only shows at fsync or close (a full
  // disk, a quota, NFS), removes the temp file and leaves `path` as it was.
  const auto give_up = [&](const std::string& what, int error) {
    const std::string why = std::strerror(error);
    if (fd >= 0) ::close(fd);
    std::remove(tmp.c_str());
    fail(what, ": ", why);
  };
  FileSink sink(fd);
  try {
    fill(fd, sink);
  } catch (...) {
    ::close(fd);
    std::remove(tmp.c_str());
    throw;
  }
  if (!sink.flush()) give_up("writing '" + path + "' failed", sink.error());
  if (::fsync(fd) != 0) give_up("syncing '" + path + "' failed", errno);
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) give_up("closing '" + path + "' failed", errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    give_up("cannot rename '" + tmp + "' to '" + path + "'", errno);
  fsync_directory(names.dir.string());
}

std::optional<std::string> read_regular_file(const std::string& path, const std::string& what, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  const bool stated = ::fstat(fd, &st) == 0;
  if (!stated || !S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = !stated                  ? "unknown"
                       : S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISCHR(st.st_mode)    ? "a character device"
                       : S_ISBLK(st.st_mode)    ? "a block device"
                       : S_ISSOCK(st.st_mode)   ? "a socket"
                                                : "not a file";
    fail(what, " '", path, "' is ", kind, ", not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    fail(what, " '", path, "' holds ", st.st_size, " bytes, more than the ", max_bytes, " it may");
  }
  std::string text;
  char chunk[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) {
      const int error = got < 0 ? errno : 0;
      ::close(fd);
      TAPEFORMER_CHECK(error == 0, what, " '", path, "': cannot read (", std::strerror(error), ")");
      return text;
    }
    if (text.size() + static_cast<size_t>(got) > max_bytes) {  // grew while being read
      ::close(fd);
      fail(what, " '", path, "' holds more than the ", max_bytes, " bytes it may");
    }
    text.append(chunk, static_cast<size_t>(got));
  }
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  write_atomic(path, [&](int, FileSink& sink) { sink.sputn(bytes.data(), static_cast<std::streamsize>(bytes.size())); });
}

void remove_stale_temp_files(const std::string& path) {
  namespace fs = std::filesystem;
  const TempName names = temp_name(path);
  std::error_code ec;
  for (fs::directory_iterator it(names.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(names.prefix, 0) != 0) continue;
    // The suffix is the writer's pid: leave the file of a writer still running.
    const std::string pid = name.substr(names.prefix.size());
    char* rest = nullptr;
    const long writer = std::strtol(pid.c_str(), &rest, 10);
    const bool running = !pid.empty() && *rest == '\0' && writer > 0 && writer != ::getpid() &&
                         (::kill(static_cast<pid_t>(writer), 0) == 0 || errno == EPERM);
    if (running) continue;
    std::error_code remove_ec;  // one that cannot be removed does not stop the others
    fs::remove(it->path(), remove_ec);
  }
}

uint64_t write_checked_file(const std::string& path, const char (&magic)[9], uint32_t version,
                            const std::function<void(std::ostream& payload)>& fill) {
  uint64_t checksum = 0;
  write_atomic(path, [&](int fd, FileSink& sink) {
    const std::string placeholder(kCheckedHeaderBytes, '\0');
    sink.sputn(placeholder.data(), static_cast<std::streamsize>(placeholder.size()));
    TAPEFORMER_CHECK(sink.start_payload(), "writing '", path, "' failed: ", std::strerror(sink.error()));
    std::ostream out(&sink);
    fill(out);
    TAPEFORMER_CHECK(out.good() && sink.flush(), "writing '", path, "' failed: ",
                     std::strerror(sink.error() != 0 ? sink.error() : EIO));
    // The header goes over its placeholder once the payload's length and hash are known.
    std::string header(magic, 8);
    const uint64_t length = sink.count(), hash = sink.hash();
    header.append(reinterpret_cast<const char*>(&version), sizeof version);
    header.append(reinterpret_cast<const char*>(&length), sizeof length);
    header.append(reinterpret_cast<const char*>(&hash), sizeof hash);
    TAPEFORMER_CHECK(::pwrite(fd, header.data(), header.size(), 0) == static_cast<ssize_t>(header.size()),
                     "writing '", path, "' failed: ", std::strerror(errno));
    checksum = hash;
  });
  return checksum;
}

CheckedFile open_checked_file(const std::string& path, const char (&magic)[9], uint32_t max_version,
                              const std::string& what) {
  check_regular_file(path, what);
  TAPEFORMER_CHECK(!std::filesystem::is_directory(path), what, " '", path, "' is a directory, not a file");
  CheckedFile f;
  f.in = std::make_unique<std::ifstream>(path, std::ios::binary);
  std::ifstream& in = *f.in;
  TAPEFORMER_CHECK(in.good(), what, " '", path, "': cannot open (", std::strerror(errno), ")");
  char header[kCheckedHeaderBytes];
  in.read(header, sizeof header);
  TAPEFORMER_CHECK(in.gcount() == static_cast<std::streamsize>(sizeof header) && std::memcmp(header, magic, 8) == 0,
                   what, " '", path, "': not a tapeformer ", what, " (bad header)");
  uint64_t checksum = 0;
  std::memcpy(&f.version, header + 8, sizeof f.version);
  std::memcpy(&f.length, header + 12, sizeof f.length);
  std::memcpy(&checksum, header + 20, sizeof checksum);
  TAPEFORMER_CHECK(f.version >= 1 && f.version <= max_version, what, " '", path, "': format version ", f.version,
                   " is not supported (this build reads versions 1 to ", max_version, ")");
  // One pass over the payload for its length and checksum, in chunks.
  std::vector<char> chunk(size_t{1} << 20);
  uint64_t seen = 0, hash = kFnvOffset;
  while (in.read(chunk.data(), static_cast<std::streamsize>(chunk.size())) || in.gcount() > 0) {
    const auto got = static_cast<size_t>(in.gcount());
    hash = fnv1a64(chunk.data(), got, hash);
    seen += got;
  }
  TAPEFORMER_CHECK(!in.bad(), what, " '", path, "': cannot read");
  TAPEFORMER_CHECK(seen >= f.length, what, " '", path, "': truncated (", seen, " of ", f.length, " payload bytes)");
  TAPEFORMER_CHECK(seen == f.length, what, " '", path, "': corrupted (", seen - f.length, " bytes after the ",
                   f.length, "-byte payload)");
  TAPEFORMER_CHECK(hash == checksum, what, " '", path, "': corrupted (checksum mismatch)");
  f.checksum = checksum;
  in.clear();
  in.seekg(static_cast<std::streamoff>(kCheckedHeaderBytes));
  TAPEFORMER_CHECK(in.good(), what, " '", path, "': cannot read");
  return f;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace tapeformer
