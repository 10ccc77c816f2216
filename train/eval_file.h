// A checkpoint's loss on a whole text file: what `eval` prints, and what
// tests, benches and SPALM's experiments read.
//
//   EvalResult r = evaluate_file("out/recipe", "input.txt");        // every token after the first, once
//   EvalArgs a;  a.checkpoint = "out/xl";  a.data = "input.txt";  a.knn.store = "xl.knn";
//   EvalResult mixed = evaluate_file(a);                            // kNN-LM's mixture (train/knn.h)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/train/knn.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/train/model_hooks.h"

namespace tapeformer {

struct EvalArgs {
  std::string checkpoint;
  std::string weights;  // a safetensors file replacing the checkpoint's weights (optional)
  std::string data;
  int64_t context = 0;  // window length in tokens; 0 = the model's block_size
  std::string split = "all";  // all | train | val: the part of the file (the checkpoint's data.val_fraction)
  KnnOptions knn;             // kNN-LM (train/knn.h); off without a store
  bool report_layers = false;  // add the figures layers log ("layers": Module::layer_metrics) to the JSON line
};

struct EvalResult {
  double loss = 0;  // mean NLL in nats per token
  int64_t tokens = 0;             // tokens predicted
  double tokens_per_char = 1;     // of the file's text, so that tokenizers compare
  double lm_loss = 0;             // with kNN-LM (lambda > 0): the model alone on the same positions; else = loss
  int64_t knn_keys = 0;           // with kNN-LM: the store's keys; else 0
  std::vector<std::pair<std::string, std::vector<double>>> layers;  // the model's layer_metrics() after reading
  double bpc() const;             // bits per character: loss / ln 2 * tokens_per_char
  double perplexity() const;      // e^loss, per token
};

// Loss of a checkpoint's model on a whole text file, in consecutive windows of
// `context` tokens (0: the block size): every token after the first is
// predicted exactly once. A model with a segment memory (model.mem_len)
// reads the windows as one stream carrying its memories (eval.mem_len
// positions, default model.mem_len, and a compressed memory), as it trained. A loss that is not finite is an Error naming the
// file the weights came from. A context past the block size needs a positional
// scheme without a table (sinusoidal, rope, alibi, shaw).
//
// With args.knn.store, each position's next-token distribution is kNN-LM's
// mixture (train/knn.h) with the store's k nearest neighbours; the store
// must come from this model and tokenizer. lambda = 0 skips the search: the
// loss is the model's, bit for bit.
EvalResult evaluate_file(const EvalArgs& args);
EvalResult evaluate_file(const std::string& checkpoint, const std::string& data_path, int64_t context = 0,
                         const std::string& weights = "");

// The model kind's hooks for a command (`who`: "eval", "sample") that reads
// a loaded model with `context` positions (sampling; 0: a text). With
// --knn, refused naming why when the kind takes no mixture, before its hooks
// open anything.
std::unique_ptr<ModelHooks> reading_hooks(const Loaded& l, int64_t context, const KnnOptions& knn, const char* who);

// The file a checkpoint's model has its weights from, for errors about them.
std::string weights_file(const std::string& checkpoint, const std::string& weights);

}  // namespace tapeformer
