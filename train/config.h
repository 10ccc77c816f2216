// TrainConfig: everything a training run needs, read from a JSON file.
//
//   TrainConfig cfg = TrainConfig::load("configs/shakespeare_char_cpu.json",
//                                       {"train.max_iters=200", "model.dropout=0.1"});
//
// Parsing is strict: an unknown key ("model.n_layers"), a value of the wrong
// type ("model.n_layer": "four") or an out-of-range value is rejected with an
// Error naming the dotted key (and, for a misspelt key, the closest known one).
// Keys starting with '_' are comments. `--set key=value` overrides use the same
// dotted keys; the value is read as JSON when it parses (3, 0.1, true, [0.9, 0.99])
// and as a string otherwise.
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include <functional>
#include <memory>

#include "tapeformer/core/registry.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/layers/transformer.h"
#include "tapeformer/optim/optimizer.h"
#include "tapeformer/optim/schedule.h"

namespace tapeformer {

struct DataConfig {
  std::string path;               // a text file, or a directory of token files; empty: must come from --data
  std::string tokenizer = "char"; // "char" | "byte" | "sentencepiece" | "byte_bpe" (tokenizer_kinds(), data/tokenizer.h)
  double val_fraction = 0.1;      // last fraction of the text (characters; bytes for "byte") is validation
  int64_t vocab_size = 0;         // sentencepiece: pieces to learn from the train split
  std::string sp_type = "bpe";    // sentencepiece: "bpe" | "unigram"
  std::string sp_model;           // sentencepiece: an existing .model file instead of learning one
  std::string tokenizer_path;     // byte_bpe: a directory with vocab.json and merges.txt, or a tokenizer.json
  // Windows start at multiples of `align` tokens from their split's start
  // (fixed-length records, e.g. images as pixel sequences); 1: anywhere.
  int64_t align = 1;
  TokenizerOptions tokenizer_options() const {
    return {tokenizer, vocab_size, sp_type, sp_model, tokenizer_path};
  }
};

struct LoopConfig {
  int64_t batch_size = 12;  // sequences per micro-batch, each block_size + 1 tokens
  int64_t grad_accum = 1;  // micro-batches per optimizer step
  int64_t max_iters = 2000;  // optimizer steps (at most 2^24)
  int64_t seed = 1337;  // initial weights, batch order, dropout and val windows
  int64_t threads = 0;  // 0 = $TAPEFORMER_THREADS when set, else all hardware threads
  // Batch shards run concurrently, one per thread (train/data_parallel.h).
  // 0 = one per thread. Results depend on the shard count (by rounding), not
  // on the thread count: set it to reproduce a run on another machine.
  int64_t shards = 0;
  // The products' operands (core/kernels/precision.h): "fp32"; "bf16"
  // (AVX512-BF16 dot products, float32 sums; weights, optimizer state, norms,
  // softmax and the loss stay float32); "bf16_portable" (the same bits on any
  // CPU, slowly: the reference bf16 is tested against). May change on resume.
  std::string precision = "fp32";
  // Activation recompute (autograd/recompute.h): "none"; "blocks" (each
  // block keeps only its input and runs its forward again in the backward);
  // "blocks:K" (every K-th block, from the first). Training is the same bits
  // as "none", with less memory and more compute. May change on resume.
  std::string recompute = "none";
  // Layers from one recomputed block to the next (LanguageModel::set_recompute), 0 for "none";
  // Error naming the key for another value.
  int64_t recompute_every() const;
};

struct OptimizerConfig {
  std::string name = "adamw";  // "adamw" | "adam" | "sgd" (optimizer_kinds(), below)
  double lr = 1e-3;  // peak learning rate (the schedule scales it)
  std::array<double, 2> betas{0.9, 0.99};  // adam/adamw moment decay rates
  double eps = 1e-8;  // adam/adamw denominator term
  double weight_decay = 0.1;  // adamw: decoupled; adam, sgd: L2 in the gradient. Rank >= 2 only
  double momentum = 0.9;  // sgd only
  bool nesterov = false;  // sgd only
  double grad_clip = 1.0;  // 0 = no clipping
  // Keys an optimizer kind declares itself (OptimizerKind::options, below), by name.
  std::map<std::string, OptionValue> options;

  // The value of an option the selected kind declares: set, else its
  // default. Error if that kind declares no such option of this type.
  double option_number(const std::string& name) const;
  int64_t option_int(const std::string& name) const;
  bool option_bool(const std::string& name) const;
  std::string option_string(const std::string& name) const;
};

struct ScheduleConfig {
  std::string name = "cosine";  // "constant" | "linear" | "cosine" | "step" (lr, then min_lr from decay_iters; schedule_kinds())
  int64_t warmup_iters = 100;
  int64_t decay_iters = 2000;
  double min_lr = 1e-4;
};

struct EvalConfig {
  int64_t interval = 250;     // evaluate every N steps (and at the end)
  int64_t iters = 20;         // val batches per periodic evaluation
  int64_t final_iters = 200;  // val batches for the final evaluation
  int64_t mem_len = 0;  // Transformer-XL models: memory kept when evaluating (0: model.mem_len)
};

struct CheckpointConfig {
  int64_t interval = 250;  // write OUT/checkpoint.bin every N steps (and at the end)
};

struct LogConfig {
  int64_t interval = 10;  // metrics line every N steps
};

struct TrainConfig {
  ModelConfig model;  // model.vocab_size comes from the tokenizer, not the file
  DataConfig data;
  LoopConfig train;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  LogConfig log;

  // Reads and validates a config file, applying `key=value` overrides.
  static TrainConfig load(const std::string& path, const std::vector<std::string>& overrides = {});
  // Parses JSON text; `origin` names the source in errors.
  static TrainConfig parse(const std::string& json_text, const std::string& origin,
                           const std::vector<std::string>& overrides = {});
  // Pretty JSON with every key (round-trips through parse).
  std::string to_json() const;
  // Every (dotted key, value as compact JSON), in a fixed order.
  std::vector<std::pair<std::string, std::string>> fields() const;
  // Throws Error naming the first invalid key.
  void validate() const;
};

// nlohmann-json's exception text without its "[json.exception.parse_error.101] "
// tag, for error lines that name the file and field themselves.
std::string json_error_text(const std::string& what);

// The optimizers and schedules a config names (`optimizer.name`,
// `schedule.name`): one table each, which the config check and the
// factories of train/build.h both read, so a name cannot be accepted by one and missing in
// the other. A program adds its own at start-up, with the keys it reads
// beyond the common ones (read back with c.option_number("lion_beta2")):
//   optimizer_kinds().add({"lion", "sign of an interpolated momentum",
//                          [](const OptimizerConfig& c, const NamedVars& params) { return std::make_unique<Lion>(...); },
//                          {{"lion_beta2", 0.99, "lion: decay of the momentum it keeps"}}});
struct OptimizerKind {
  std::string name;
  std::string summary;  // one line, for docs
  std::function<std::unique_ptr<Optimizer>(const OptimizerConfig&, const NamedVars&)> make;
  // Its own optimizer.* keys (name without "optimizer."), with defaults and
  // docs: a config may set them only when it selects this kind.
  std::vector<ModelOption> options = {};
};
struct ScheduleKind {
  std::string name;
  std::string summary;
  std::function<std::unique_ptr<Schedule>(const TrainConfig&)> make;
};
Registry<OptimizerKind>& optimizer_kinds();
Registry<ScheduleKind>& schedule_kinds();


// Keys that may differ between a checkpoint's config and the one given with
// --resume (they change how long, how verbosely and in which precision a run
// goes, not its model or data).
bool key_may_change_on_resume(const std::string& key);

// A resumed run's config: `saved` (the checkpoint's) becomes `wanted` (the
// command's), which may differ only in the keys above; otherwise Error
// naming the key and both values. The vocabulary stays the checkpoint's.
// A run not `started` (no step trained yet: an imported model) may change
// every key but model.* (model.dropout may) and the tokenizer's data.* keys.
void adopt_resume_config(TrainConfig& saved, const TrainConfig& wanted, const std::string& out_dir,
                         bool started = true);

}  // namespace tapeformer
