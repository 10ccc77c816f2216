// Number flags for programs built on CLI11 (the tapeformer commands, bench/,
// examples/): one parser for every value, core/numbers.h's.
//
//   CLI::App app{"my program"};
//   uint64_t seed = 1;
//   number_option(&app, "--seed", seed, "random seed")->capture_default_str();
//   number_option(&app, "--lr", lr, "learning rate")->check(finite_above_zero);
//   check_number_options(app);   // Error when a number flag was added without number_option
//   app.parse(argc, argv);       // --seed -1, 1e23, 2^64 or '' is refused, naming the flag
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/core/numbers.h"

namespace tapeformer {

// Every number flag is added by number_option: core/numbers.h parses its
// value (the whole text, the range of the field's type, finite, not empty)
// before CLI11 converts it, which would wrap -1 or 2^64 into an unsigned
// field, cap 1e39 and read '' as 0. A bad value is a command-line mistake
// (exit status 2), and CLI11 puts the flag's name before the message. The
// checks below narrow the range further; cli_main refuses to start when a
// number flag was added any other way (check_number_options).
// The number type a flag holds: T, or T for a list of them.
template <class T>
struct flag_number_type {
  using type = T;
};
template <class T>
struct flag_number_type<std::vector<T>> {
  using type = T;
};

// `range`, when given, narrows the type's range (integer_in, unit_interval,
// ...) and words the refusal of any value outside it, a number of another
// type included ("--tokens: must be an integer in [0, 2147483647], got
// '9223372036854775808'", not the range of the field's int64_t).
template <class T>
CLI::Option* number_option(CLI::App* app, const std::string& name, T& value, const std::string& help,
                           std::optional<CLI::Validator> range = std::nullopt) {
  using N = typename flag_number_type<T>::type;
  return app->add_option(name, value, help)
      ->check(CLI::Validator(
          [range](std::string& text) {
            const std::string why = number_error<N>(text);
            const std::string narrower = range ? (*range)(text) : std::string();
            if (!narrower.empty()) return narrower;
            if (!why.empty()) return "must be " + why;
            // CLI11 reads integers in base 0: "010" would be 8. The decimal value goes on instead.
            if constexpr (std::is_integral_v<N>) text = std::to_string(parse_number<N>(text, ""));
            return std::string();
          },
          "", "number"));
}
// A flag's value as a double for the range checks below (NaN, which every
// check refuses, when it is no finite number).
inline double flag_number(const std::string& text) {
  return number_error<double>(text).empty() ? parse_number<double>(text, "") : std::nan("");
}
inline const CLI::Validator finite_at_least_zero(
    [](std::string& text) {
      return flag_number(text) >= 0 ? std::string() : "must be a finite number >= 0, got '" + text + "'";
    },
    "");
inline const CLI::Validator probability_mass(
    [](std::string& text) {
      const double v = flag_number(text);
      return v > 0 && v <= 1 ? std::string() : "must be a number in (0, 1], got '" + text + "'";
    },
    "");
inline const CLI::Validator open_fraction(
    [](std::string& text) {
      const double v = flag_number(text);
      return v > 0 && v < 1 ? std::string() : "must be a number in (0, 1), got '" + text + "'";
    },
    "");
inline const CLI::Validator unit_interval(
    [](std::string& text) {
      const double v = flag_number(text);
      return v >= 0 && v <= 1 ? std::string() : "must be a number in [0, 1], got '" + text + "'";
    },
    "");
inline const CLI::Validator finite_above_zero(
    [](std::string& text) {
      return flag_number(text) > 0 ? std::string() : "must be a finite number > 0, got '" + text + "'";
    },
    "");
// An integer in [lo, hi].
inline CLI::Validator integer_in(uint64_t lo, uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) {
        const bool in = number_error<uint64_t>(text).empty() && parse_number<uint64_t>(text, "number") >= lo &&
                        parse_number<uint64_t>(text, "number") <= hi;
        const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
        return in ? std::string() : "must be an integer in " + range + ", got '" + text + "'";
      },
      "");
}
inline CLI::Validator integer_up_to(uint64_t hi) { return integer_in(0, hi); }

// Counts a flag may give (tokens, top-k, context, vocabulary size): as a
// config's counts, at most 2^31 - 1.
inline constexpr uint64_t kMaxCount = INT32_MAX;

// Every option that holds a number was added by number_option: a flag added
// with add_option alone would wrap and cap its values unchecked.
inline void check_number_options(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    const std::string full = o->get_type_name();  // "INT", or "INT:..." with a check's description
    const std::string type = full.substr(0, full.find(':'));
    if (type != "INT" && type != "UINT" && type != "FLOAT") continue;
    try {
      o->get_validator("number");
    } catch (const CLI::OptionNotFound&) {
      fail("internal: the number flag ", o->get_name(), " of '", app.get_name(), "' was not added by number_option");
    }
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) check_number_options(*sub);
}

}  // namespace tapeformer
