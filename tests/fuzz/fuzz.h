// Shared by the fuzz targets: the libFuzzer entry point and the one way a
// target reports a broken property. Each target is also built, with any
// compiler, as a replay program (replay_main.cpp) that ctest runs over the
// target's seed corpus in tests/fuzz/corpus/, so the harnesses compile and
// their regression inputs pass in every build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tapeformer/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace tapeformer::fuzz {

// A property every input must keep; a broken one aborts, which libFuzzer
// reports as a crash and saves the input.
inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: property broken: %s\n", what);
  std::abort();
}

// Runs f, which may throw tapeformer::Error (bad input, refused cleanly) and
// nothing else: any other exception escapes to libFuzzer as a crash. Returns
// true when f completed.
template <class F>
bool refused_or_done(F&& f) {
  try {
    f();
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace tapeformer::fuzz
