// A checkpoint of a freshly initialised model: what load_model reads, without training.
#pragma once

#include <memory>
#include <string>

#include "tapeformer/data/tokenizer.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/config.h"
#include "temp_dir.h"

// Writes DIR/NAME.bin: cfg's model initialised from `seed`, with `tok`; returns its path.
inline std::string save_fresh_checkpoint(const TempDir& dir, const std::string& name, const tapeformer::TrainConfig& cfg,
                                         const tapeformer::Tokenizer& tok, uint64_t seed) {
  tapeformer::Rng rng(seed);
  const std::unique_ptr<tapeformer::LanguageModel> model = tapeformer::make_model(cfg.model, rng);
  tapeformer::Checkpoint c;
  c.config_json = cfg.to_json();
  c.tokenizer = tapeformer::save_tokenizer(tok);
  c.model = model->state();
  const std::string path = (dir.path / (name + ".bin")).string();
  tapeformer::save_checkpoint(path, c);
  return path;
}
