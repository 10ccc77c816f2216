// Fuzz target: importing safetensors weights (train/export.h) into a fixed
// GPT of nanoGPT's architecture (1 layer, width 16, 2 heads, block 8, a
// vocabulary of 11, tied head; corpus/safetensors/valid.safetensors is an
// export of one).
// - The input, as a whole file, is accepted or refused with tapeformer::Error.
// - The input as the header text, behind a valid length prefix and in front
//   of the valid file's data section, likewise: this reaches the header
//   checks (duplicate names, byte ranges, unknown tensors, the tied head)
//   with data of the right size.
// - An accepted file leaves finite weights, and exporting them and importing
//   the export gives the same weights bit for bit.
#include <cmath>
#include <fstream>
#include <string>

#include "fuzz.h"
#include "temp_dir.h"
#include "tapeformer/train/export.h"

namespace {

using namespace tapeformer;

ModelConfig fuzz_model_config() {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void import_file(const std::string& path, const std::string& bytes) {
  write(path, bytes);
  Rng rng(1);
  TransformerLM model(fuzz_model_config(), rng);
  if (!fuzz::refused_or_done([&] { import_safetensors(model, path); })) return;
  for (const auto& [name, t] : model.state()) {
    const Tensor c = t.contiguous();
    for (int64_t i = 0; i < c.numel(); ++i) fuzz::require(std::isfinite(c.data()[i]), "an accepted file loads a non-finite weight");
  }
  const std::string again = path + ".again";
  export_safetensors(model, again);
  Rng other(2);
  TransformerLM copy(fuzz_model_config(), other);
  import_safetensors(copy, again);
  const NamedTensors a = model.state(), b = copy.state();
  for (size_t i = 0; i < a.size(); ++i)
    fuzz::require(a[i].second.to_vector() == b[i].second.to_vector(), "export then import changes the weights");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const TempDir dir("fuzz-safetensors");  // scratch files per process, removed at exit
  static const std::string path = (dir.path / "w.safetensors").string();
  // A valid file's data section: the export of a model built like the target's.
  static const std::string valid_data = [] {
    Rng rng(3);
    TransformerLM model(fuzz_model_config(), rng);
    const std::string p = (dir.path / "valid.safetensors").string();
    export_safetensors(model, p);
    const std::string bytes = read(p);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
    return bytes.substr(8 + n);
  }();
  const std::string input(reinterpret_cast<const char*>(data), size);

  import_file(path, input);
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[static_cast<size_t>(i)] = static_cast<char>((size >> (8 * i)) & 0xff);
  import_file(path, prefix + input + valid_data);
  return 0;
}
