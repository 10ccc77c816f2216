// The bodies of the `tapeformer` subcommands, callable in-process (tests use
// them directly; cli/main.cpp only parses flags).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tapeformer/data/tokenizer.h"
#include "tapeformer/layers/transformer.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/config.h"
#include "tapeformer/train/knn.h"
#include "tapeformer/train/sample.h"

namespace tapeformer {

// A checkpoint's model (in eval mode) and tokenizer, ready for inference;
// with `weights`, a safetensors file replacing the checkpoint's weights.
// checkpoint: a run directory or a checkpoint file.
struct Loaded {
  TrainConfig cfg;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<LanguageModel> model;
};
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

struct TrainArgs {
  std::string config;                  // JSON config; optional with resume
  std::string data;                    // overrides data.path when set
  std::string out = "out";             // run directory
  std::vector<std::string> overrides;  // key=value
  bool resume = false;
  bool profile = false;  // Trainer::set_profile
};

struct SampleArgs {
  std::string checkpoint;  // run directory or checkpoint file
  std::string weights;     // a safetensors file replacing the checkpoint's weights (optional)
  std::string prompt = "\n";  // "-": read from stdin
  std::string prompt_file;    // when set, the prompt is this file's text
  SampleOptions options;
  KnnOptions knn;             // a kNN-LM store mixed into each token's distribution (train/knn.h)
  // Images (train/image.h): `images` samples of options.tokens pixel letters
  // each from the prompt, drawn `image_width` pixels wide into the PNG `png`.
  std::string png;
  int64_t image_width = 0;
  int64_t images = 16;
  bool report_layers = false;  // after sampling, the figures layers log (an early-exit model's mean layers used) on stderr
};

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

struct PrepareArgs {
  std::string data;                // the text file
  std::string out;                 // the directory for train.bin, val.bin, tokenizer.bin
  TokenizerOptions tokenizer;      // kind "char" | "byte" | "sentencepiece" (+ vocab_size, sp_type, sp_model)
  double val_fraction = 0.1;
};
// Writes nanoGPT-style token files (data/token_file.h) with a progress bar
// on stderr (when it is a terminal); prints {"train_tokens", "val_tokens", "vocab_size"} on stdout.
// Train on them with --data DIR (or data.path = DIR).
int run_prepare(const PrepareArgs& args);

struct ExportArgs {
  std::string checkpoint;  // run directory or checkpoint file
  std::string output;      // the file to write
  std::string format = "safetensors";
};
// Writes the checkpoint's weights (train/export.h); prints one line naming the file.
int run_export(const ExportArgs& args);

// Trains (or resumes); prints the final TrainResult JSON line on stdout.
int run_train(const TrainArgs& args);
// Prints the prompt followed by the generated text on stdout. A prompt file
// or stdin must be text (no NUL byte, at most 64 MiB); NaN or inf logits are
// an Error naming the file the weights came from, before the prompt is printed.
int run_sample(const SampleArgs& args);
// Prints {"loss", "bpc", "perplexity", "tokens"} as one JSON line on stdout;
// with --knn also "lm_loss", "lm_bpc" (the model alone) and "knn" {"keys",
// "k", "lambda", "temperature", "index"}.
int run_eval(const EvalArgs& args);

// Keys that may differ between a checkpoint's config and the one given with
// --resume (they change how long and how verbosely a run goes, not its math).
bool key_may_change_on_resume(const std::string& key);

// A resumed run's config: `saved` (the checkpoint's) becomes `wanted` (the
// command's), which may differ only in the keys above; otherwise Error
// naming the key and both values. The vocabulary stays the checkpoint's.
void adopt_resume_config(TrainConfig& saved, const TrainConfig& wanted, const std::string& out_dir);

}  // namespace tapeformer
