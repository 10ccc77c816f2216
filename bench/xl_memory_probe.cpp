// E4a's diagnostic (docs/math.md#experiments): does a trained Transformer-XL use its memory?
// Evaluates a checkpoint over its run's val split read as B streams in order
// (as training evaluates it), three ways: with the memory carried from
// segment to segment; with no memory (reset before every segment); and with
// the memory of another stream (rows rotated by one, so each row remembers
// text that does not precede it). A model that uses its memory does best
// with its own and worst with another stream's.
//
//   build/bench/xl_memory_probe --checkpoint out/run [--data FILE] [--mem-len M]
//
// --data defaults to the run's data.path; --mem-len (0: the model's) sets the
// memory kept. Prints one JSON line with the three mean losses.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "tapeformer/autograd/ops.h"
#include "bench/bench_common.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/core/error.h"
#include "tapeformer/data/corpus.h"
#include "tapeformer/data/sampler.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/layers/transformer.h"
#include "tapeformer/train/eval_file.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/train/config.h"
#include "tapeformer/train/metrics.h"

using namespace tapeformer;

namespace {

// Row r of every layer's memory replaced by row r + 1's (mod B).
void rotate_rows(SegmentMemory& memory) {
  for (Tensor& t : memory.group("layers")) {
    const int64_t B = t.dim(0);
    t = concat({Var(t.slice(0, 1, B)), Var(t.slice(0, 0, 1))}, 0).value();
  }
}

int run(int argc, char** argv) {
  CLI::App app{"E4a diagnostic: val loss with the memory carried, absent, or another stream's"};
  std::string checkpoint, data;
  int64_t mem_len = 0;
  app.add_option("--checkpoint", checkpoint, "run directory (holding checkpoint.bin)")->required();
  app.add_option("--data", data, "text file of the run (default: its data.path)");
  number_option(&app, "--mem-len", mem_len, "memory kept (0: the model's mem_len)")->capture_default_str();
  check_number_options(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  Loaded l = load_model(checkpoint);
  const TrainConfig& cfg = l.cfg;
  LanguageModel& model = *l.model;
  const std::string path = checkpoint;
  Rng rng(0);
  TAPEFORMER_CHECK(model.memory_use().carried(), "xl_memory_probe: the model in '", path, "' has no memory (model.mem_len)");
  const TextCorpus corpus = TextCorpus::from_file(data.empty() ? cfg.data.path : data, *l.tokenizer, cfg.data.val_fraction);
  NoGradGuard no_grad;
  const auto mean_loss = [&](const char* how) {
    StreamSampler val(corpus.val(), cfg.train.batch_size, cfg.model.block_size, "val split");
    SegmentMemory memory;
    memory.limit = mem_len;
    double total = 0;
    const int64_t n = val.segments();
    for (int64_t i = 0; i < n; ++i) {
      const Batch b = val.next();
      if (std::string(how) == "none") memory.reset();
      if (std::string(how) == "other" && memory.batch() > 0) rotate_rows(memory);
      total += cross_entropy(model.forward(b.inputs, memory, rng), b.targets).item();
    }
    return total / static_cast<double>(n);
  };
  const double carried = mean_loss("carried"), none = mean_loss("none"), other = mean_loss("other");
  std::printf("{\"val_loss_memory\": %s, \"val_loss_no_memory\": %s, \"val_loss_other_stream\": %s, "
              "\"gain_over_no_memory\": %s}\n",
              json_number(carried).c_str(), json_number(none).c_str(), json_number(other).c_str(),
              json_number(none - carried).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("xl_memory_probe", run, argc, argv); }
