// What the benchmark programs run by the experiment harness share: list
// options, the metrics file (OUT/metrics.jsonl, a JSON line per point, echoed
// on stderr) and a main() that turns an exception into one error line.
#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/core/numbers.h"

namespace tapeformer::bench {

// "64,128,256" -> {64, 128, 256}; Error naming `what` (the flag) for an item
// that is no int64_t (core/numbers.h: "", "1e3", "0x10" and 2^63 are refused).
inline std::vector<int64_t> parse_list(const std::string& text, const std::string& what) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(parse_number<int64_t>(item, what));
  return out;
}

// OUT/metrics.jsonl (nothing when out is empty); every line also goes to stderr.
class MetricsFile {
 public:
  MetricsFile(const std::string& out, const char* program) {
    if (out.empty()) return;
    std::filesystem::create_directories(out);
    file_ = std::fopen((out + "/metrics.jsonl").c_str(), "w");
    TAPEFORMER_CHECK(file_ != nullptr, program, ": cannot write '", out, "/metrics.jsonl'");
  }
  ~MetricsFile() {
    if (file_) std::fclose(file_);
  }
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;
  void write(const char* line) {
    std::fprintf(stderr, "%s\n", line);
    if (file_) std::fprintf(file_, "%s\n", line), std::fflush(file_);
  }

 private:
  std::FILE* file_ = nullptr;
};

// run(argc, argv), with any exception printed as "PROGRAM: error: ..." and exit status 1.
inline int guarded_main(const char* program, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace tapeformer::bench
