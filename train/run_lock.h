// RunLock: one writer per run directory.
//
//   RunLock lock(out_dir);   // Error when another process trains there, naming its PID
//
// An exclusive flock(2) on OUT/train.lock, held while the object lives. The
// kernel releases it when the process ends, however it ends (kill -9
// included), so a dead run never leaves a stale lock; the file itself stays
// and is reused. The holder writes its PID into the file for the message a
// second writer gets. Readers (`sample`, `eval`) take no lock: they read the
// atomically written checkpoint.
#pragma once

#include <string>

namespace tapeformer {

class RunLock {
 public:
  explicit RunLock(const std::string& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  static const char* file_name() { return "train.lock"; }

 private:
  int fd_ = -1;
};

}  // namespace tapeformer
