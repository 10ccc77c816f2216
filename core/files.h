// Checks on a path before it is opened for reading.
//
//   check_regular_file(path, "config");   // Error "config 'in.fifo' is a FIFO, not a regular file"
//
// Opening a FIFO with no writer blocks forever, and reading a character
// device or socket may never end: every file tapeformer reads (configs,
// corpora, token files, tokenizers, checkpoints, weights) is refused up front
// when it is one of those. A missing path or a directory passes: the caller
// opens it and reports that in its own words.
#pragma once

#include <string>

namespace tapeformer {

// Throws Error "WHAT 'PATH' is a KIND, not a regular file" when path names a
// FIFO, a character or block device or a socket (after following symlinks).
void check_regular_file(const std::string& path, const std::string& what);

}  // namespace tapeformer
