#include "tapeformer/train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "tapeformer/core/error.h"

namespace tapeformer {

RunLock::RunLock(const std::string& dir) {
  const std::string path = dir + "/" + file_name();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  TAPEFORMER_CHECK(fd_ >= 0, "cannot open the run lock '", path, "': ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    TAPEFORMER_CHECK(error != EWOULDBLOCK, "run directory '", dir, "' is in use by process ",
                     holder.empty() ? "?" : holder, " (it holds '", path,
                     "'): one run writes a directory at a time; wait for it to end or choose another --out");
    fail("cannot lock the run directory '", dir, "' ('", path, "'): ", std::strerror(error));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  // Best effort: the PID only makes a second writer's message more useful.
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace tapeformer
