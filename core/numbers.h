// One number parser for every flag, config value and environment variable.
//
//   const uint64_t seed = parse_number<uint64_t>(text, "--seed");    // Error "--seed must be an integer in [0, 18446744073709551615], got '1e23'"
//   const float lr = parse_number<float>(text, "optimizer.lr");      // Error "optimizer.lr must be a finite number, got '1e39'"
//   const std::string why = number_error<int32_t>(text);             // "" when text is an int32_t, else the reason
//
// The whole text must be the number: no blank around it, no empty text, no
// trailing characters. An integer is decimal digits with a '-' only for a
// signed type, and must lie in its type's range (an integer never wraps:
// 18446744073709551616 or -1 for an unsigned type is refused, not taken as
// 2^64-1). A floating value may use an exponent ("3e-4") and must be finite
// in the type it is stored in (1e39 is inf as a float: refused). Every
// refusal names what was parsed and quotes the text as given.
#pragma once

#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "tapeformer/core/error.h"

namespace tapeformer {

// Why `text` is not a value of T ("" when it is one): "an integer in [lo, hi]"
// or "a finite number", followed by ", got 'TEXT'".
template <class T>
std::string number_error(const std::string& text) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, "number_error: a number type");
  if constexpr (std::is_integral_v<T>) {
    const std::string want = "an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                             std::to_string(std::numeric_limits<T>::max()) + "], got '" + text + "'";
    T v{};
    const char* end = text.data() + text.size();
    const auto r = std::from_chars(text.data(), end, v, 10);
    if (text.empty() || r.ec != std::errc() || r.ptr != end) return want;
    return {};
  } else {
    const std::string want = "a finite number, got '" + text + "'";
    double v = 0;
    const char* end = text.data() + text.size();
    const auto r = std::from_chars(text.data(), end, v, std::chars_format::general);
    // A value beyond the type's range (1e39 as a float, 1e400 as a double) is no finite T.
    if (text.empty() || r.ec != std::errc() || r.ptr != end || !std::isfinite(v) || !std::isfinite(static_cast<T>(v)))
      return want;
    return {};
  }
}

// The value of `text` as T; Error "WHAT must be ..., got 'TEXT'" otherwise.
template <class T>
T parse_number(const std::string& text, const std::string& what) {
  const std::string why = number_error<T>(text);
  if (!why.empty()) fail(what, " must be ", why);
  if constexpr (std::is_integral_v<T>) {
    T v{};
    std::from_chars(text.data(), text.data() + text.size(), v, 10);
    return v;
  } else {
    double v = 0;
    std::from_chars(text.data(), text.data() + text.size(), v, std::chars_format::general);
    return static_cast<T>(v);
  }
}

}  // namespace tapeformer
