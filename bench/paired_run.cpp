// Paired run, tapeformer side: trains a recipe from the initial weights and
// on the batches that `bench/paired_run.py prepare` wrote into DIR, and writes
// DIR/tapeformer.jsonl: one line per step {"step", "lr", "train_loss",
// "grad_norm"} (the norm before clipping), then {"final_val_loss"}. With the
// PyTorch reference run the same way in float32 and float64, the two
// implementations can be compared step by step (bench/paired_run.sh).
//
//   paired_run CONFIG DATA DIR [key=value ...]
//
// The step is the Trainer's own (train_step in train/build.h: schedule,
// grad_accum micro-batches through DataParallel, clipping folded into the
// optimizer step). Only the batches and the initial weights come from
// outside.
#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/data/corpus.h"
#include "tapeformer/data/sampler.h"
#include "tapeformer/train/build.h"
#include "tapeformer/train/config.h"
#include "tapeformer/train/data_parallel.h"

namespace tapeformer {
namespace {

// init.txt: "NAME d0 d1 ..." per tensor; init.bin: their float32 values in order.
NamedTensors read_initial_weights(const std::string& dir) {
  std::ifstream names(dir + "/init.txt"), values(dir + "/init.bin", std::ios::binary);
  TAPEFORMER_CHECK(names && values, "cannot read '", dir, "/init.txt' and '", dir,
                   "/init.bin' (run bench/paired_run.py prepare first)");
  NamedTensors state;
  for (std::string line; std::getline(names, line);) {
    std::istringstream in(line);
    std::string name;
    Shape shape;
    in >> name;
    for (int64_t d; in >> d;) shape.push_back(d);
    Tensor t = Tensor::empty(shape);
    values.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(t.numel() * sizeof(float)));
    TAPEFORMER_CHECK(values.gcount() == static_cast<std::streamsize>(t.numel() * sizeof(float)), "'", dir,
                     "/init.bin' ends inside '", name, "'");
    state.emplace_back(name, t);
  }
  TAPEFORMER_CHECK(values.peek() == std::char_traits<char>::eof(), "'", dir, "/init.bin' is longer than init.txt says");
  return state;
}

int run(int argc, char** argv) {
  TAPEFORMER_CHECK(argc >= 4, "usage: paired_run CONFIG DATA DIR [key=value ...]");
  const std::string dir = argv[3];
  TrainConfig cfg = TrainConfig::load(argv[1], std::vector<std::string>(argv + 4, argv + argc));
  TAPEFORMER_CHECK(cfg.model.dropout == 0, "model.dropout must be 0 (dropout masks differ between implementations)");
  parallel::set_num_threads(static_cast<int>(cfg.train.threads));
  LoadedCorpus data = load_corpus(argv[2], cfg.data.tokenizer, cfg.data.val_fraction);
  cfg.model.vocab_size = data.tokenizer->vocab_size();

  Rng unused_init(0);
  TransformerLM model(cfg.model, unused_init);
  model.load_state(read_initial_weights(dir));
  std::unique_ptr<Optimizer> optimizer = make_optimizer(cfg.optimizer, model.named_parameters());
  std::unique_ptr<Schedule> schedule = make_schedule(cfg);
  DataParallel shards(model, static_cast<int>(shard_count(cfg)));

  std::vector<Batch> train, final;
  std::ifstream batches(dir + "/batches.txt");
  TAPEFORMER_CHECK(batches.good(), "cannot read '", dir, "/batches.txt'");
  for (std::string line; std::getline(batches, line);) {
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    std::vector<int64_t> starts;
    for (int64_t o; in >> o;) starts.push_back(o);
    if (kind == "train") train.push_back(window_batch(data.corpus.train(), starts, cfg.model.block_size));
    else final.push_back(window_batch(data.corpus.val(), starts, cfg.model.block_size));
  }
  TAPEFORMER_CHECK(static_cast<int64_t>(train.size()) == cfg.train.max_iters * cfg.train.grad_accum && !final.empty(),
                   "'", dir, "/batches.txt' does not match the config (prepare it with the same config)");

  std::FILE* out = std::fopen((dir + "/tapeformer.jsonl").c_str(), "w");
  TAPEFORMER_CHECK(out != nullptr, "cannot write '", dir, "/tapeformer.jsonl'");
  Rng no_dropout(0);
  model.train();
  for (int64_t step = 0; step < cfg.train.max_iters; ++step) {
    int64_t next = step * cfg.train.grad_accum;
    const StepResult r = train_step(cfg, step, shards, model.parameters(), *optimizer, *schedule,
                                    [&] { return train[next++]; }, no_dropout);
    std::fprintf(out, "{\"step\": %lld, \"lr\": %.9g, \"train_loss\": %.9g, \"grad_norm\": %.9g}\n",
                 static_cast<long long>(step + 1), r.lr, r.loss, r.grad_norm);
  }
  model.eval();
  double val = 0;
  for (double loss : shards.losses(final, no_dropout)) val += loss;
  std::fprintf(out, "{\"final_val_loss\": %.9g}\n", val / static_cast<double>(final.size()));
  TAPEFORMER_CHECK(std::fclose(out) == 0, "cannot write '", dir, "/tapeformer.jsonl'");
  return 0;
}

}  // namespace
}  // namespace tapeformer

int main(int argc, char** argv) {
  try {
    return tapeformer::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "paired_run: %s\n", e.what());
    return 1;
  }
}
