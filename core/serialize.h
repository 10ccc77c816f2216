// Bounded reading for cereal binary archives.
//
//   vocab.resize(read_count(ar, kMaxVocab, "vocabulary"));
//   ar(cereal::binary_data(vocab.data(), vocab.size() * sizeof(uint32_t)));
//
// cereal resizes a string or vector to whatever count the bytes in front of it
// claim, so a damaged count in a file becomes a request for gigabytes before
// the short read is noticed. Reading the count here first, against the most
// the field can hold, turns it into an Error naming the field. The layout read
// is cereal's own (a u64 count, then the elements), so files do not change.
#pragma once

#include <cereal/cereal.hpp>
#include <cstddef>
#include <cstdint>

#include "core/error.h"

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

}  // namespace tapeformer
