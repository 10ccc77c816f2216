// The number parser every flag and value goes through, running a program
// without a shell, and reading a file that may be a FIFO without blocking.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/core/numbers.h"
#include "tapeformer/core/subprocess.h"
#include "temp_dir.h"

using namespace tapeformer;

TEST_CASE("parse_number: integers in their type's range, never wrapped") {
  CHECK(parse_number<uint64_t>("18446744073709551615", "--seed") == UINT64_MAX);
  CHECK(parse_number<int64_t>("-9223372036854775808", "x") == INT64_MIN);
  CHECK(parse_number<int32_t>("-7", "x") == -7);
  // One past the type's range, a sign an unsigned type has not, and what is no integer.
  for (const char* bad : {"18446744073709551616", "-1", "1e23", "1.0", "", " 1", "1 ", "+1", "0x10", "1_000", "nan"})
    CHECK_THROWS_WITH_AS(parse_number<uint64_t>(bad, "--seed"),
                         ("--seed must be an integer in [0, 18446744073709551615], got '" + std::string(bad) + "'").c_str(),
                         Error);
  CHECK_THROWS_WITH_AS(parse_number<int32_t>("4294967301", "--target-return"),
                       "--target-return must be an integer in [-2147483648, 2147483647], got '4294967301'", Error);
  CHECK_THROWS_WITH_AS(parse_number<int32_t>("2147483648", "x"), doctest::Contains("got '2147483648'"), Error);
  CHECK(parse_number<int32_t>("2147483647", "x") == INT32_MAX);
  // Leading zeros are decimal, not octal.
  CHECK(parse_number<int64_t>("010", "x") == 10);
  CHECK(number_error<int64_t>("12").empty());
  CHECK(number_error<int64_t>("12a") == "an integer in [-9223372036854775808, 9223372036854775807], got '12a'");
}

TEST_CASE("parse_number: floating values finite in the type they are stored in") {
  CHECK(parse_number<double>("3e-4", "optimizer.lr") == 3e-4);
  CHECK(parse_number<float>("-2.5", "x") == -2.5f);
  CHECK(parse_number<double>("1e300", "x") == 1e300);
  for (const char* bad : {"inf", "-inf", "nan", "1e400", "", "1.5x", " 1", "0x1p3", "--1"})
    CHECK_THROWS_WITH_AS(parse_number<double>(bad, "--threshold"),
                         ("--threshold must be a finite number, got '" + std::string(bad) + "'").c_str(), Error);
  // Finite as a double, not as a float.
  CHECK(parse_number<double>("1e39", "x") == 1e39);
  CHECK_THROWS_WITH_AS(parse_number<float>("1e39", "--temperature"), "--temperature must be a finite number, got '1e39'",
                       Error);
}

TEST_CASE("run_program: arguments as they are, stdin in, stdout and stderr out, the exit status") {
  // A name that a shell would run twice is one argument here.
  const ProgramResult echo = run_program({"echo", "a; touch /nonexistent/PWNED", "$(id)"}, "");
  CHECK(echo.status == 0);
  CHECK(echo.out == "a; touch /nonexistent/PWNED $(id)\n");
  CHECK(echo.err.empty());
  // Input larger than a pipe holds, echoed back while it is written.
  std::string big(1 << 20, 'x');
  for (size_t i = 0; i < big.size(); i += 1000) big[i] = '\n';
  const ProgramResult cat = run_program({"cat"}, big);
  CHECK(cat.status == 0);
  CHECK(cat.out == big);
  const ProgramResult fails = run_program({"sh", "-c", "echo oops >&2; exit 3"}, "");
  CHECK(fails.status == 3);
  CHECK(fails.err == "oops\n");
  // A program that exits without reading its input: EPIPE, not this process's end by SIGPIPE.
  const ProgramResult early = run_program({"true"}, std::string(1 << 22, 'y'));
  CHECK(early.status == 0);
  CHECK_THROWS_WITH_AS(run_program({"tapeformer-no-such-program"}, ""),
                       "cannot run tapeformer-no-such-program: not installed (no tapeformer-no-such-program on PATH)",
                       Error);
  CHECK_THROWS_WITH_AS(run_program({"sh", "-c", "head -c 5000 /dev/zero"}, "", 4096),
                       "sh wrote more than 4096 bytes on stdout", Error);
}

TEST_CASE("read_regular_file: a FIFO or a directory is refused at once, a missing file is nullopt") {
  TempDir dir("read-regular");
  const std::string fifo = (dir.path / "in.fifo").string(), text = (dir.path / "a.txt").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(read_regular_file(fifo, "plot: the metrics file", 100),
                       ("plot: the metrics file '" + fifo + "' is a FIFO, not a regular file").c_str(), Error);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));  // no writer was waited for
  CHECK_THROWS_WITH_AS(read_regular_file(dir.path.string(), "input", 100),
                       ("input '" + dir.path.string() + "' is a directory, not a regular file").c_str(), Error);
  CHECK_THROWS_WITH_AS(read_regular_file("/dev/zero", "input", 100),
                       "input '/dev/zero' is a character device, not a regular file", Error);
  CHECK_FALSE(read_regular_file((dir.path / "missing").string(), "input", 100).has_value());
  std::ofstream(text) << "hello\n";
  CHECK(read_regular_file(text, "input", 100) == std::optional<std::string>("hello\n"));
  CHECK_THROWS_WITH_AS(read_regular_file(text, "input", 3), ("input '" + text + "' holds 6 bytes, more than the 3 it may").c_str(),
                       Error);
}

TEST_CASE("write_file_atomic: a failure names the file asked for, not its temp file") {
  TempDir dir("atomic-name");
  const std::string target = (dir.path / "missing" / "grid.png").string();
  CHECK_THROWS_WITH_AS(write_file_atomic(target, "x"), doctest::Contains(("cannot write '" + target + "': No such file").c_str()),
                       Error);
}
