// Fuzz target: the JSON config reader (train/config.h).
// - Any text, as a config file or as one `--set key=value` override, is
//   either accepted or refused with tapeformer::Error (never another
//   exception, a crash or a hang);
// - an accepted config passes validate() and survives to_json() -> parse()
//   with every field unchanged.
#include <string>

#include "fuzz.h"
#include "tapeformer/train/config.h"

namespace {

void check_round_trip(const tapeformer::TrainConfig& cfg) {
  using tapeformer::fuzz::require;
  cfg.validate();  // throws Error, which the caller does not expect here
  const tapeformer::TrainConfig again = tapeformer::TrainConfig::parse(cfg.to_json(), "round trip");
  require(again.fields() == cfg.fields(), "to_json -> parse changes a field");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tapeformer;
  const std::string text(reinterpret_cast<const char*>(data), size);
  TrainConfig cfg;
  if (fuzz::refused_or_done([&] { cfg = TrainConfig::parse(text, "fuzz input"); })) check_round_trip(cfg);
  if (fuzz::refused_or_done([&] { cfg = TrainConfig::parse("{}", "defaults", {text}); })) check_round_trip(cfg);
  return 0;
}
