#include "tapeformer/core/files.h"

#include <sys/stat.h>

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

}  // namespace tapeformer
