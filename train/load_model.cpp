#include "tapeformer/train/load_model.h"

#include <filesystem>

#include "tapeformer/core/error.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/train/export.h"
#include "tapeformer/train/model_hooks.h"

namespace tapeformer {
namespace fs = std::filesystem;

std::string checkpoint_file(const std::string& checkpoint) {
  return fs::is_directory(checkpoint) ? (fs::path(checkpoint) / "checkpoint.bin").string() : checkpoint;
}

std::unique_ptr<LanguageModel> load_checkpoint_model(const Checkpoint& c, const ModelConfig& cfg,
                                                     const std::string& path) {
  Rng unused(0);
  std::unique_ptr<LanguageModel> model = make_model(cfg, unused);
  try {
    model->load_state(c.model);
  } catch (const Error& e) {
    fail("checkpoint '", path, "' does not match its own config: ", e.what());
  }
  model->eval();
  return model;
}

Loaded load_model(const Checkpoint& c, const std::string& path, const std::string& weights) {
  Loaded l;
  l.cfg = TrainConfig::parse(c.config_json, "in checkpoint '" + path + "'");
  TAPEFORMER_CHECK(!c.tokenizer.empty(), "checkpoint '", path, "' holds no tokenizer, so it reads no text: it was "
                   "trained on ", task_run_origin(l.cfg.model.arch));
  l.tokenizer = load_tokenizer(c.tokenizer);
  l.cfg.model.vocab_size = l.tokenizer->vocab_size();
  l.model = load_checkpoint_model(c, l.cfg.model, path);
  if (!weights.empty()) import_safetensors(*l.model, weights);  // the checkpoint's config, these weights
  return l;
}

Loaded load_model(const std::string& checkpoint, const std::string& weights) {
  const std::string path = checkpoint_file(checkpoint);
  return load_model(load_checkpoint(path), path, weights);
}

}  // namespace tapeformer
