// Replays files (or every file in directories) through a fuzz target's
// LLVMFuzzerTestOneInput, for builds without libFuzzer. Exit 0 when every
// input ran; a broken property aborts, as under the fuzzer.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      inputs.push_back(p);
    } else {
      std::cerr << "replay: no such file or directory: " << p << "\n";
      return 2;
    }
  }
  if (inputs.empty()) {
    std::cerr << "replay: no inputs (usage: " << argv[0] << " FILE|DIR ...)\n";
    return 2;
  }
  for (const auto& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::cout << "replay: " << inputs.size() << " inputs passed\n";
  return 0;
}
