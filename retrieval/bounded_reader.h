// BoundedReader: reads a file part's fields front to back, each checked
// against the bytes of the part not read yet, so a forged size or count is
// refused before anything past the part is read or allocated for it. Used
// inside retrieval/ (the kNN store's payload, the FAISS index's layout); not
// part of the library's interface.
//
//   BoundedReader r{in, bytes, origin, "cannot decode"};
//   const auto n = r.get<int64_t>("the count");  // Error "<origin>: cannot decode (the count cut short)"
//   r.bytes(buffer, size, "the values");
#pragma once

#include <cstdint>
#include <istream>
#include <string>

#include "tapeformer/core/error.h"

namespace tapeformer {

struct BoundedReader {
  std::istream& in;
  uint64_t left;              // bytes of the part not read yet
  const std::string& origin;  // names the file in errors
  const char* complaint;      // what a field cut short makes of the file: "cannot decode", "corrupt index"

  // The next sizeof(T) bytes as a T (a trivially copyable type); `field` names it in errors.
  template <class T>
  T get(const char* field) {
    T v{};
    TAPEFORMER_CHECK(left >= sizeof v && in.read(reinterpret_cast<char*>(&v), sizeof v), origin, ": ", complaint,
                     " (", field, " cut short)");
    left -= sizeof v;
    return v;
  }
  // The next n bytes into `to`.
  void bytes(void* to, uint64_t n, const char* field) {
    TAPEFORMER_CHECK(n <= left && in.read(static_cast<char*>(to), static_cast<std::streamsize>(n)), origin, ": ",
                     complaint, " (", field, " cut short)");
    left -= n;
  }
};

}  // namespace tapeformer
