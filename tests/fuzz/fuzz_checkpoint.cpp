// Fuzz target: reading a checkpoint (train/checkpoint.h) and the tokenizer
// state inside one (data/tokenizer.h).
// - The input, as a whole file, is accepted or refused with tapeformer::Error.
// - The input wrapped in a valid header (magic, version, length, checksum),
//   so that it reaches cereal's payload decoding, likewise; an accepted
//   payload has tensors whose value counts match their shapes.
// - The input as a serialised tokenizer is refused with Error, or gives a
//   tokenizer that decodes its whole vocabulary and encodes it back.
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <unistd.h>

#include "data/tokenizer.h"
#include "fuzz.h"
#include "train/checkpoint.h"

namespace {

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

uint64_t fnv1a64(const std::string& s) {  // the checkpoint format's checksum
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// One scratch file per process, removed at exit.
struct TempFile {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("tapeformer_fuzz_" + std::to_string(getpid()) + ".bin")).string();
  ~TempFile() { std::filesystem::remove(path); }
};

void load_file(const std::string& path, const std::string& bytes) {
  using namespace tapeformer;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  Checkpoint c;
  if (!fuzz::refused_or_done([&] { c = load_checkpoint(path); })) return;
  for (const auto* tensors : {&c.model, &c.optimizer})
    for (const auto& [name, t] : *tensors)
      fuzz::require(t.numel() == t.shape().numel(), "tensor size differs from its shape");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tapeformer;
  static const TempFile file;
  const std::string& path = file.path;
  const std::string input(reinterpret_cast<const char*>(data), size);

  load_file(path, input);
  std::string wrapped("TFCKPT01");
  put<uint32_t>(wrapped, kCheckpointVersion);
  put<uint64_t>(wrapped, input.size());
  put<uint64_t>(wrapped, fnv1a64(input));
  load_file(path, wrapped + input);

  std::unique_ptr<Tokenizer> tok;
  if (fuzz::refused_or_done([&] { tok = load_tokenizer(input); })) {
    std::vector<int32_t> ids(static_cast<size_t>(tok->vocab_size()));
    std::iota(ids.begin(), ids.end(), 0);
    const std::string text = tok->decode(ids);
    fuzz::require(tok->encode(text) == ids, "a loaded tokenizer does not round-trip its vocabulary");
  }
  return 0;
}
