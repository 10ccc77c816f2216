// RunLock: one writer per run directory, for as long as the directory is
// the one it locked.
//
//   RunLock lock(out_dir);   // Error when another process trains there, naming its PID
//   lock.check_held();       // before each write: Error when out_dir was removed or replaced
//
// Two exclusive flock(2)s, held while the object lives: on the directory
// itself, so deleting OUT/train.lock does not free the run, and on
// OUT/train.lock, where the holder writes its PID for the message a second
// writer gets. The kernel releases both when the process ends, however it
// ends (kill -9 included), so a dead run never leaves a stale lock. A
// directory removed and made again under the same name is another
// directory: its new run locks it, and check_held() tells the old one that
// the path is no longer its own, so it never writes over the new run.
// Readers (`sample`, `eval`) take no lock: they read the atomically written
// checkpoint.
#pragma once

#include <sys/types.h>

#include <string>

namespace tapeformer {

class RunLock {
 public:
  explicit RunLock(const std::string& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  static const char* file_name() { return "train.lock"; }

  // Whether the path still names the directory this lock holds.
  bool held() const;
  // Error naming the directory unless held().
  void check_held() const;
  // A path to `name` inside the locked directory itself, whatever its path
  // names now (/proc/self/fd/N/name): a write there can never land in a
  // directory made again under the same path, and fails if it was removed.
  std::string path_in(const std::string& name) const;

 private:
  std::string dir_;
  int dir_fd_ = -1, fd_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace tapeformer
