// Fuzz target: reading a checkpoint (train/checkpoint.h) and the tokenizer
// state inside one (data/tokenizer.h).
// - The input, as a whole file, is accepted or refused with tapeformer::Error.
// - The input wrapped in a valid header (magic, version, length, checksum),
//   so that it reaches the payload decoding, likewise; so are the config and
//   the tokenizer inside an accepted one.
// - The input as a serialised tokenizer is refused with Error, or gives a
//   tokenizer that decodes its whole vocabulary and encodes it back.
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "tapeformer/data/tokenizer.h"
#include "fuzz.h"
#include "temp_dir.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/config.h"

namespace {

void load_file(const std::string& path, const std::string& bytes) {
  using namespace tapeformer;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  Checkpoint c;
  if (!fuzz::refused_or_done([&] { c = load_checkpoint(path); })) return;
  // What `tapeformer sample` and `eval` decode next: the config and the tokenizer.
  fuzz::refused_or_done([&] { TrainConfig::parse(c.config_json, "in the checkpoint"); });
  fuzz::refused_or_done([&] { load_tokenizer(c.tokenizer); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tapeformer;
  static const TempDir dir("fuzz-checkpoint");  // one scratch file per process, removed at exit
  static const std::string path = (dir.path / "checkpoint.bin").string();
  const std::string input(reinterpret_cast<const char*>(data), size);

  load_file(path, input);
  load_file(path, checkpoint_file_bytes(input));

  std::unique_ptr<Tokenizer> tok;
  if (fuzz::refused_or_done([&] { tok = load_tokenizer(input); })) {
    std::vector<int32_t> ids(static_cast<size_t>(tok->vocab_size()));
    std::iota(ids.begin(), ids.end(), 0);
    const std::string text = tok->decode(ids);
    fuzz::require(tok->encode(text) == ids, "a loaded tokenizer does not round-trip its vocabulary");
  }
  return 0;
}
