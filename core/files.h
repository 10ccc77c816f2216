// Files: checks on a path before it is opened for reading, atomic writes,
// and the FNV-1a 64 checksum that tapeformer's own file formats carry.
//
//   check_regular_file(path, "config");   // Error "config 'in.fifo' is a FIFO, not a regular file"
//   write_file_atomic(path, bytes);        // a crash leaves the old file or the new one
//   write_atomic(path, [&](int fd, FileSink& sink) { std::ostream out(&sink); ... });   // streamed
//
// Opening a FIFO with no writer blocks forever, and reading a character
// device or socket may never end: every file tapeformer reads (configs,
// corpora, token files, tokenizers, checkpoints, weights, kNN stores) is
// refused up front when it is one of those. A missing path or a directory
// passes: the caller opens it and reports that in its own words.
//
// Atomic writes go to ".NAME.tmp.PID" in the target's directory, are
// fsync'ed, renamed over the target, and the directory is fsync'ed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <streambuf>
#include <string>
#include <vector>

namespace tapeformer {

// Throws Error "WHAT 'PATH' is a KIND, not a regular file" when path names a
// FIFO, a character or block device or a socket (after following symlinks).
void check_regular_file(const std::string& path, const std::string& what);

// The whole of a small file, opened without blocking and refused (Error
// "WHAT 'PATH' is a FIFO, not a regular file") unless it is a regular file,
// or when it holds more than max_bytes; nullopt when it cannot be opened
// (errno says why), for the caller to word.
std::optional<std::string> read_regular_file(const std::string& path, const std::string& what, size_t max_bytes);

// FNV-1a 64 of n bytes, continuing from the hash h of the bytes before them.
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
inline uint64_t fnv1a64(const char* p, size_t n, uint64_t h = kFnvOffset) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 0x100000001b3ULL;
  return h;
}
inline uint64_t fnv1a64(const std::string& s) { return fnv1a64(s.data(), s.size()); }
// A checksum or fingerprint as it is printed in messages and configs: 16 lowercase hex digits.
std::string hex64(uint64_t v);

// Buffered writes to a file descriptor for a std::ostream, with the FNV-1a 64
// hash and the count of the bytes that pass after start_payload() (or all
// of them). Write errors are kept (with errno) for the caller, which reports
// them once.
class FileSink : public std::streambuf {
 public:
  explicit FileSink(int fd) : fd_(fd), buf_(size_t{1} << 20) { setp(buf_.data(), buf_.data() + buf_.size()); }
  uint64_t count() const { return count_ + static_cast<uint64_t>(pptr() - pbase()); }
  uint64_t hash() const { return hash_; }  // of what flush() has written
  int error() const { return error_; }
  bool flush() { return drain() && error_ == 0; }
  // Writes what came so far (a header), and counts and hashes only what follows.
  bool start_payload() {
    const bool ok = flush();
    count_ = 0;
    hash_ = kFnvOffset;
    return ok;
  }

 protected:
  int_type overflow(int_type ch) override;
  int sync() override { return drain() ? 0 : -1; }

 private:
  bool drain();
  int fd_;
  std::vector<char> buf_;
  uint64_t count_ = 0;
  uint64_t hash_ = kFnvOffset;
  int error_ = 0;
};

// Writes `path` atomically: `fill` writes the contents to a temp file (a
// stream, or the descriptor itself for fixed-offset patches), which is then
// fsync'ed and renamed over `path`. Any failure, including one that only
// shows at fsync or close (a full disk, a quota, NFS), or an exception from
// `fill`, removes the temp file and leaves `path` as it was.
void write_atomic(const std::string& path, const std::function<void(int fd, FileSink& sink)>& fill);
// Writes bytes to path atomically.
void write_file_atomic(const std::string& path, const std::string& bytes);
// Removes the temp files ".NAME.tmp.PID" that writes of `path` interrupted by
// a kill left next to it, except those of a process PID still running (best
// effort; the file itself is never touched).
void remove_stale_temp_files(const std::string& path);

// Checked files: magic (8 bytes), format version (u32), payload length
// (u64), FNV-1a 64 of the payload (u64), then the payload (the layout of
// checkpoints; used by kNN stores and vector indexes).
//
//   write_checked_file(path, "TFKNNDS1", 1, [&](std::ostream& out) { ... });   // atomic; returns the checksum
//   CheckedFile f = open_checked_file(path, "TFKNNDS1", 1, "kNN store");       // verified
//   read from f.in: exactly f.length payload bytes follow
inline constexpr size_t kCheckedHeaderBytes = 8 + 4 + 8 + 8;
uint64_t write_checked_file(const std::string& path, const char (&magic)[9], uint32_t version,
                            const std::function<void(std::ostream& payload)>& fill);
struct CheckedFile {
  std::unique_ptr<std::ifstream> in;  // at the first payload byte
  uint32_t version = 0;
  uint64_t length = 0;                // payload bytes
  uint64_t checksum = 0;              // the payload's FNV-1a 64 (verified)
};
// Refuses a FIFO or device, a missing file ("WHAT 'PATH': cannot open"),
// another kind of file ("not a WHAT (bad header)"), a version above
// max_version, a truncated file and a checksum mismatch ("corrupted"),
// each an Error naming WHAT and PATH. The checksum is checked by streaming
// the file once (memory stays bounded) before the payload is handed out.
CheckedFile open_checked_file(const std::string& path, const char (&magic)[9], uint32_t max_version,
                              const std::string& what);

}  // namespace tapeformer
