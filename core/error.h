// tapeformer::Error — the one exception type for caller mistakes.
//
// Every public entry point checks its arguments and throws Error with a
// message that names the operation, the argument and the shapes/values:
//
//   TAPEFORMER_CHECK(a.dim(-1) == b.dim(-2),
//                    "matmul: inner dims differ: ", a.shape(), " x ", b.shape());
//
// Internal invariants use assert (compiled out in Release); user input never does.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tapeformer {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Concatenates the arguments with operator<< and throws Error.
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  throw Error(out.str());
}

}  // namespace tapeformer

// Throws tapeformer::Error built from the message parts when cond is false.
// The parts are only formatted on failure.
#define TAPEFORMER_CHECK(cond, ...)          \
  do {                                       \
    if (!(cond)) ::tapeformer::fail(__VA_ARGS__); \
  } while (0)
