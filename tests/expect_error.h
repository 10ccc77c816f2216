// expect_error: runs fn, requires a tapeformer::Error (not another
// exception, not none), and checks that its message contains every part.
//
//   expect_error([&] { matmul(a, b); }, {"matmul", "[4, 8] x [7, 3]"});
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "tapeformer/core/error.h"

namespace {

[[maybe_unused]] void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  std::string message;
  try {
    fn();
  } catch (const tapeformer::Error& e) {
    message = e.what();
  } catch (const std::exception& e) {
    FAIL("threw a non-Error exception: ", e.what());
    return;
  }
  REQUIRE_MESSAGE(!message.empty(), "no Error thrown; expected one mentioning '", parts.front(), "'");
  for (const std::string& p : parts) CHECK_MESSAGE(message.find(p) != std::string::npos, "'", p, "' not in: ", message);
}

}  // namespace
