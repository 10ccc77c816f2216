// A file size limit (RLIMIT_FSIZE) with SIGXFSZ ignored, so a write past it
// fails with EFBIG part way, as a full disk would; undone on leaving the
// scope, however it is left.
#pragma once

#include <doctest/doctest.h>
#include <sys/resource.h>

#include <csignal>

struct FileSizeLimit {
  struct rlimit saved {};
  void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
  explicit FileSizeLimit(rlim_t bytes) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    struct rlimit small = saved;
    small.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old_handler);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
};
