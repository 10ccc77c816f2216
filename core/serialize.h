// Bounded reading for cereal binary archives, and cereal byte blobs.
//
//   read_bounded(ar, vocab, kMaxVocab, "vocabulary");   // count checked, then the elements
//   std::string bytes = to_bytes(state);
//   from_bytes(bytes, state, "tokenizer: cannot decode");
//
// cereal resizes a string or vector to whatever count the bytes in front of it
// claim, so a damaged count in a file becomes a request for gigabytes before
// the short read is noticed. Reading the count here first, against the most
// the field can hold, turns it into an Error naming the field. The layout read
// is cereal's own (a u64 count, then the elements), so files do not change.
#pragma once

#include <cereal/archives/binary.hpp>
#include <cereal/cereal.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "tapeformer/core/error.h"

namespace tapeformer {

// Reads a container's element count; Error "WHAT: a count of N, more than the
// MAX possible" when it exceeds max.
template <class Archive>
size_t read_count(Archive& ar, uint64_t max, const char* what) {
  cereal::size_type n = 0;
  ar(cereal::make_size_tag(n));
  TAPEFORMER_CHECK(n <= max, what, ": a count of ", n, ", more than the ", max, " possible");
  return static_cast<size_t>(n);
}

// A string of at most max bytes, or a vector of at most max numbers, in the
// layout cereal's binary archives give them.
template <class Archive>
void read_bounded(Archive& ar, std::string& s, uint64_t max, const char* what) {
  s.resize(read_count(ar, max, what));
  ar(cereal::binary_data(s.data(), s.size()));
}
template <class Archive, class T>
void read_bounded(Archive& ar, std::vector<T>& v, uint64_t max, const char* what) {
  static_assert(std::is_arithmetic_v<T>, "read_bounded: a vector of numbers");
  v.resize(read_count(ar, max, what));
  ar(cereal::binary_data(v.data(), v.size() * sizeof(T)));
}

// value as a cereal binary blob.
template <class T>
std::string to_bytes(const T& value) {
  std::ostringstream out;
  {
    cereal::BinaryOutputArchive ar(out);
    ar(value);
  }
  return out.str();
}

// cereal's "Failed to read N bytes from input stream!" in the words of a
// file that ends early; any other message as it is.
inline std::string cut_short_message(const std::string& what, size_t blob_bytes) {
  unsigned long long wanted = 0;
  if (std::sscanf(what.c_str(), "Failed to read %llu bytes", &wanted) != 1) return what;
  return "it ends early: a field of " + std::to_string(wanted) + " bytes runs past the end of its " +
         std::to_string(blob_bytes) + " bytes";
}

// Reads value back from to_bytes' blob; Error "CONTEXT (cereal's or load()'s
// message)" when the blob is short or refused. A bad_alloc is not relabelled.
template <class T>
void from_bytes(const std::string& bytes, T& value, const std::string& context) {
  try {
    std::istringstream in(bytes);
    cereal::BinaryInputArchive ar(in);
    ar(value);
  } catch (const std::runtime_error& e) {
    fail(context, " (", cut_short_message(e.what(), bytes.size()), ")");
  }
}

}  // namespace tapeformer
