#include "tapeformer/train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "tapeformer/core/error.h"
#include "tapeformer/core/numbers.h"

namespace tapeformer {
namespace {

// "process PID" as the holder wrote it into the lock file, or "another
// process" when the file holds no PID (emptied, or written over by hand).
std::string holder_of(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return "another process";
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  ::close(fd);
  std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  return number_error<int32_t>(holder).empty() && parse_number<int32_t>(holder, "") > 0 ? "process " + holder
                                                                                         : "another process";
}

[[noreturn]] void refuse(const std::string& dir, const std::string& path, int error) {
  TAPEFORMER_CHECK(error != EWOULDBLOCK, "run directory '", dir, "' is in use by ", holder_of(path),
                   " (it holds the directory and '", path,
                   "'): one run writes a directory at a time; wait for it to end or choose another --out");
  fail("cannot lock the run directory '", dir, "' ('", path, "'): ", std::strerror(error));
}

}  // namespace

RunLock::RunLock(const std::string& dir) : dir_(dir) {
  const std::string path = dir + "/" + file_name();
  dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TAPEFORMER_CHECK(dir_fd_ >= 0, "cannot open the run directory '", dir, "': ", std::strerror(errno));
  struct stat st {};
  if (::flock(dir_fd_, LOCK_EX | LOCK_NB) != 0 || ::fstat(dir_fd_, &st) != 0) {
    const int error = errno;
    ::close(dir_fd_);
    dir_fd_ = -1;
    refuse(dir, path, error);
  }
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  fd_ = ::openat(dir_fd_, file_name(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0 || ::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (fd_ >= 0) ::close(fd_);
    ::close(dir_fd_);
    fd_ = dir_fd_ = -1;
    if (error == EWOULDBLOCK) refuse(dir, path, error);
    fail("cannot open the run lock '", path, "': ", std::strerror(error));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  // Best effort: the PID only makes a second writer's message more useful.
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the locks
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

bool RunLock::held() const {
  struct stat st {};
  return ::stat(dir_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
}

std::string RunLock::path_in(const std::string& name) const {
  const std::string fd_dir = "/proc/self/fd/" + std::to_string(dir_fd_);
  struct stat st {};
  const bool through_fd = ::stat(fd_dir.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
  return (through_fd ? fd_dir : dir_) + "/" + name;
}

void RunLock::check_held() const {
  TAPEFORMER_CHECK(held(), "the run directory '", dir_, "' was ", ::access(dir_.c_str(), F_OK) == 0 ? "replaced" : "removed",
                   " while this process (", ::getpid(), ") was training into it: it stops without writing there, so "
                   "that nothing another run keeps at that path is overwritten");
}

}  // namespace tapeformer
