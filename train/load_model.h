// A checkpoint's model, ready for inference: what every command that reads
// a run (eval, sample, export, knn build, calibrate, rl eval) and SPALM's
// retriever load, in eval mode.
//
//   Loaded l = load_model("out/recipe");                        // a run directory or a checkpoint file
//   Loaded w = load_model("out/recipe", "model.safetensors");   // the checkpoint's config, these weights
//
// Errors name the checkpoint: a file that is not one, weights that do not
// fit its own config, and a run with no tokenizer (one trained on a task,
// the Decision Transformer's episodes: it reads no text).
#pragma once

#include <memory>
#include <string>

#include "tapeformer/data/tokenizer.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/config.h"

namespace tapeformer {

// A checkpoint's model (in eval mode) and tokenizer; with `weights`, a
// safetensors file replacing the checkpoint's weights.
struct Loaded {
  TrainConfig cfg;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<LanguageModel> model;
};
// checkpoint: a run directory or a checkpoint file.
Loaded load_model(const std::string& checkpoint, const std::string& weights = "");
// The same from a checkpoint already read from `path` (calibrate rewrites it).
Loaded load_model(const Checkpoint& c, const std::string& path, const std::string& weights = "");
// A checkpoint's model alone, built from `cfg` (its config, with the
// vocabulary the caller knows: rl eval's, the dataset's actions), in eval
// mode; Error naming `path` when the weights do not fit the config.
std::unique_ptr<LanguageModel> load_checkpoint_model(const Checkpoint& c, const ModelConfig& cfg,
                                                     const std::string& path);
// A run directory's checkpoint.bin, or `checkpoint` itself when it is a file.
std::string checkpoint_file(const std::string& checkpoint);

}  // namespace tapeformer
