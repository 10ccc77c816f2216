// E4c (docs/math.md#experiments): recall across segments. A model reads endless streams T
// tokens at a time, as Transformer-XL reads a corpus; every segment ends with
// a query for the key seen `--distance` segments earlier (data/tasks.h,
// RecallTask). With model.mem_len > 0 the segment memory is carried from
// each segment to the next (training and evaluation); without one the model
// sees only the current segment and can do no better than chance.
//
//   build/examples/recall_task --config configs/e4c_recall.json --out out/e4c/xl --distance 2
//       [--set model.mem_len=0] [--set model.n_layer=4]
//
// The config is a training config (model.*, optimizer.*, schedule.*, train.*,
// eval.interval / eval.iters (segments per evaluation) / eval.final_iters,
// log.*, checkpoint.*); model.block_size is the segment length. The library's
// Trainer runs it on the task (TaskData; --resume continues OUT):
// OUT/metrics.jsonl gets "recall" on evaluation steps. Prints one JSON line
// with the final figures (recall: the fraction of queries answered with the
// right key; chance is 1 / keys).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/data/tasks.h"
#include "tapeformer/train/commands.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/trainer.h"

using namespace tapeformer;

namespace {

struct Recall {
  double loss = 0, accuracy = 0;
};

// Reads `warmup` segments, then scores the queries of `segments` more, from
// fresh streams of `seed` and a fresh memory.
Recall evaluate(LanguageModel& model, const RecallTaskConfig& task_cfg, int64_t batch, uint64_t seed,
                int64_t segments) {
  model.eval();
  NoGradGuard no_grad;
  Rng unused(0);
  RecallTask task(task_cfg, batch, seed);
  SegmentMemory memory;
  const auto forward = [&](const IndexTensor& ids) {
    return model.mem_len() > 0 ? model.forward(ids, memory, unused) : model.forward(ids, unused);  // (B, T, V)
  };
  for (int64_t i = 0; i < task_cfg.distance; ++i) forward(task.next().inputs);
  double loss = 0;
  int64_t right = 0, counted = 0;
  for (int64_t i = 0; i < segments; ++i) {
    const Batch b = task.next();
    const Var logits = forward(b.inputs);
    loss += cross_entropy(logits, b.targets).item();
    const int64_t B = b.inputs.shape[0], T = b.inputs.shape[1], V = logits.dim(2);
    for (int64_t r = 0; r < B; ++r) {
      const int32_t want = b.targets.data[static_cast<size_t>(r * T + T - 1)];
      const Scalar* row = logits.value().data() + (r * T + T - 1) * V;
      right += std::max_element(row, row + V) - row == want;
      ++counted;
    }
  }
  model.train();
  return {loss / static_cast<double>(segments), static_cast<double>(right) / static_cast<double>(counted)};
}

int run(int argc, char** argv) {
  CLI::App app{"E4c: recall of a key across segments (writes OUT/metrics.jsonl)"};
  std::string config_path, out = "out/recall_task";
  std::vector<std::string> overrides;
  RecallTaskConfig task_cfg;
  app.add_option("--config", config_path, "training config (model, optimizer, schedule, train, eval)")->required();
  app.add_option("--out", out, "output directory")->capture_default_str();
  app.add_option("--set", overrides, "override a config value (repeatable)");
  app.add_option("--distance", task_cfg.distance, "segments between a key and its query")->capture_default_str();
  app.add_option("--keys", task_cfg.keys, "distinct keys (chance is 1 / keys)")->capture_default_str();
  app.add_option("--fillers", task_cfg.fillers, "distinct filler symbols")->capture_default_str();
  bool resume = false;
  app.add_flag("--resume", resume, "continue the run saved in OUT (give the same task flags and --set values)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  const TrainConfig cfg = TrainConfig::load(config_path, overrides);
  task_cfg.segment = cfg.model.block_size;
  // Random streams from train.seed, s = seed * 1000003: the weights s (the
  // Trainer's), training segments s + 1, evaluation s + 2 and final
  // evaluation s + 4, dropout s + 3.
  const auto seed = static_cast<uint64_t>(cfg.train.seed) * 1000003ULL;
  TaskData task;
  task.name = "recall_task";
  auto train_task = std::make_unique<RecallTask>(task_cfg, cfg.train.batch_size, seed + 1);
  task.vocab_size = train_task->vocab_size();
  task.batches = std::move(train_task);
  task.warmup_batches = task_cfg.distance;  // the first `distance` segments have no query to answer yet
  task.dropout_seed = seed + 3;
  task.evaluate = [&](LanguageModel& m, bool final) {
    const Recall v = final ? evaluate(m, task_cfg, cfg.train.batch_size, seed + 4, cfg.eval.final_iters)
                           : evaluate(m, task_cfg, cfg.train.batch_size, seed + 2, cfg.eval.iters);
    if (!final) std::fprintf(stderr, "recall %.4f\n", v.accuracy);
    return TaskEvaluation{v.loss, {{"recall", v.accuracy}}};
  };
  std::unique_ptr<Trainer> trainer =
      resume ? Trainer::resume(out, std::move(task), [&](TrainConfig& saved) { adopt_resume_config(saved, cfg, out); })
             : std::make_unique<Trainer>(cfg, out, std::move(task));
  const TrainResult result = trainer->run();
  const LanguageModel& model = trainer->model();
  const double loss = result.train_loss, seconds = result.train_seconds;
  const Recall fin{result.val_loss, result.val_fields.at(0).second};
  std::printf("{\"steps\": %lld, \"train_loss\": %s, \"val_loss\": %s, \"recall\": %s, \"chance\": %s, "
              "\"distance\": %lld, \"mem_len\": %lld, \"layers\": %lld, \"train_seconds\": %.3f}\n",
              static_cast<long long>(cfg.train.max_iters), json_number(loss).c_str(), json_number(fin.loss).c_str(),
              json_number(fin.accuracy).c_str(), json_number(1.0 / static_cast<double>(task_cfg.keys)).c_str(),
              static_cast<long long>(task_cfg.distance), static_cast<long long>(model.mem_len()),
              static_cast<long long>(cfg.model.n_layer), seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("recall_task", run, argc, argv); }
