// Recall across segments. A model reads endless streams T tokens at a time,
// as Transformer-XL reads a corpus, and answers queries whose answer lies
// `--distance` segments back (data/tasks.h):
//   E4c (RecallTask): every segment ends with a query for the key seen
//     `--distance` segments earlier; with model.mem_len > 0 the segment
//     memory is carried from each segment to the next (training and
//     evaluation); without one the model can do no better than chance.
//   --associative (AssociativeRecallTask, the Memorizing Transformer's
//     experiment): every segment states `--facts` facts `KEY value name` and
//     asks for the value of one of its names (local) and of one of the names
//     stated `--distance` segments earlier (far), which a memory searched by
//     content (model.xmem_len) can reach beyond the segment memory. With
//     --max-distance each far query's distance is drawn from [--distance,
//     --max-distance], and --eval-distances scores the final model at each
//     listed distance alone ("recall_dN").
//
//   build/examples/recall_task --config configs/e4c_recall.json --out out/e4c/xl --distance 2
//       [--set model.mem_len=0] [--set model.n_layer=4]
//   build/examples/recall_task --config configs/memorizing_recall.json --associative --distance 8
//       --out out/recall/mem [--set model.xmem_len=0]
//   build/examples/recall_task --config configs/memorizing_recall.json --associative --names 32
//       --distance 1 --max-distance 6 --eval-distances 1,2,3,4,5,6 --out out/recall/mixed
//
// The config is a training config (model.*, optimizer.*, schedule.*, train.*,
// eval.interval / eval.iters (segments per evaluation) / eval.final_iters,
// log.*, checkpoint.*); model.block_size is the segment length. The library's
// Trainer runs it on the task (TaskData; --resume continues OUT):
// OUT/metrics.jsonl gets "recall" (and "local_recall") on evaluation steps.
// Prints one JSON line with the final figures (recall: the fraction of far
// queries answered with the right key or value; chance is 1 / keys or
// 1 / values).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/data/tasks.h"
#include "tapeformer/train/config.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/trainer.h"

using namespace tapeformer;

namespace {

struct Recall {
  double loss = 0, accuracy = 0, local_accuracy = 0;
};

// Reads `warmup` segments, then scores the queries of `segments` more, from
// fresh streams (made by `make_task`) and a fresh memory: the far query's
// target sits at T - 1, the associative task's local one at T - 3.
Recall evaluate(LanguageModel& model, const std::function<std::unique_ptr<BatchSource>()>& make_task, int64_t warmup,
                int64_t segments) {
  model.eval();
  NoGradGuard no_grad;
  Rng unused(0);
  const std::unique_ptr<BatchSource> task = make_task();
  SegmentMemory memory;
  const auto forward = [&](const IndexTensor& ids) {
    return model.memory_use().carried() ? model.forward(ids, memory, unused) : model.forward(ids, unused);  // (B, T, V)
  };
  for (int64_t i = 0; i < warmup; ++i) forward(task->next().inputs);
  double loss = 0;
  int64_t right[2] = {0, 0}, counted[2] = {0, 0};  // far, local
  for (int64_t i = 0; i < segments; ++i) {
    const Batch b = task->next();
    const Var logits = forward(b.inputs);
    loss += cross_entropy(logits, b.targets).item();
    const int64_t B = b.inputs.shape[0], T = b.inputs.shape[1], V = logits.dim(2);
    for (int64_t r = 0; r < B; ++r)
      for (int which = 0; which < 2; ++which) {
        const int64_t t = which == 0 ? T - 1 : T - 3;
        const int32_t want = b.targets.data[static_cast<size_t>(r * T + t)];
        if (want == kIgnoreTarget) continue;
        const Scalar* row = logits.value().data() + (r * T + t) * V;
        right[which] += std::max_element(row, row + V) - row == want;
        ++counted[which];
      }
  }
  model.train();
  const auto share = [](int64_t n, int64_t d) { return d > 0 ? static_cast<double>(n) / static_cast<double>(d) : 0.0; };
  return {loss / static_cast<double>(segments), share(right[0], counted[0]), share(right[1], counted[1])};
}

int run(int argc, char** argv) {
  CLI::App app{"Recall across segments (E4c; --associative: the Memorizing Transformer's task); writes OUT/metrics.jsonl"};
  std::string config_path, out = "out/recall_task";
  std::vector<std::string> overrides;
  RecallTaskConfig key_cfg;
  AssociativeRecallConfig assoc_cfg;
  bool associative = false;
  int64_t distance = 1, max_distance = 0, fillers = 16;
  std::vector<int64_t> eval_distances;
  app.add_option("--config", config_path, "training config (model, optimizer, schedule, train, eval)")->required();
  app.add_option("--out", out, "output directory")->capture_default_str();
  app.add_option("--set", overrides, "override a config value (repeatable)");
  app.add_flag("--associative", associative, "the associative task: KEY value name, queried by name");
  number_option(&app, "--distance", distance, "segments between a key (a fact) and its query")->capture_default_str();
  number_option(&app, "--max-distance", max_distance,
                "associative: each far query's distance drawn from [--distance, --max-distance] (0: fixed)")
      ->capture_default_str();
  number_option(&app, "--eval-distances", eval_distances,
                 "associative: at the end, the far recall at each of these distances alone (recall_dN)")
      ->delimiter(',');
  number_option(&app, "--fillers", fillers, "distinct filler symbols")->capture_default_str();
  number_option(&app, "--keys", key_cfg.keys, "E4c: distinct keys (chance is 1 / keys)")->capture_default_str();
  number_option(&app, "--names", assoc_cfg.names,
                "associative: distinct names (one returns at the earliest names / 2 facts later)")
      ->capture_default_str();
  number_option(&app, "--facts", assoc_cfg.facts, "associative: facts per segment")->capture_default_str();
  number_option(&app, "--values", assoc_cfg.values, "associative: distinct values (chance is 1 / values)")
      ->capture_default_str();
  bool resume = false;
  app.add_flag("--resume", resume, "continue the run saved in OUT (give the same task flags and --set values)");
  check_number_options(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  const TrainConfig cfg = TrainConfig::load(config_path, overrides);
  key_cfg.distance = assoc_cfg.distance = distance;
  assoc_cfg.max_distance = max_distance;
  if (!associative && (max_distance != 0 || !eval_distances.empty()))
    throw Error("recall_task: --max-distance and --eval-distances need --associative");
  const int64_t farthest = std::max(distance, max_distance);  // segments read before the first scored one
  key_cfg.fillers = assoc_cfg.fillers = fillers;
  key_cfg.segment = assoc_cfg.segment = cfg.model.block_size;
  const int64_t batch = cfg.train.batch_size;
  const auto make_task = [&](uint64_t seed) -> std::unique_ptr<BatchSource> {
    if (associative) return std::make_unique<AssociativeRecallTask>(assoc_cfg, batch, seed);
    return std::make_unique<RecallTask>(key_cfg, batch, seed);
  };
  // Random streams from train.seed (train/streams.h): the Trainer's weights, and the task's training
  // segments, evaluation, final evaluation and dropout.
  const int64_t seed = cfg.train.seed;
  TaskData task;
  task.name = "recall_task";
  task.batches = make_task(stream_seed(seed, TaskStream::batches));
  const auto at_distance = [&](int64_t d) {  // the task with every far query d segments back
    AssociativeRecallConfig c = assoc_cfg;
    c.distance = d;
    c.max_distance = 0;
    return c;
  };
  for (const int64_t d : eval_distances) AssociativeRecallTask(at_distance(d), batch, 0);  // bad distances fail now
  task.vocab_size = associative ? AssociativeRecallTask(assoc_cfg, batch, 0).vocab_size()
                                : RecallTask(key_cfg, batch, 0).vocab_size();
  task.warmup_batches = farthest;  // the first segments have no far query to answer yet
  task.dropout_seed = stream_seed(seed, TaskStream::dropout);
  task.evaluate = [&](LanguageModel& m, bool final) {
    const Recall v = evaluate(m, [&] { return make_task(stream_seed(seed, final ? TaskStream::final_evaluation : TaskStream::evaluation)); }, farthest,
                              final ? cfg.eval.final_iters : cfg.eval.iters);
    if (!final) std::fprintf(stderr, "recall %.4f\n", v.accuracy);
    TaskEvaluation e{v.loss, {{"recall", v.accuracy}}};
    if (associative) e.fields.emplace_back("local_recall", v.local_accuracy);
    if (final)
      for (const int64_t d : eval_distances) {
        const uint64_t final_seed = stream_seed(seed, TaskStream::final_evaluation);
        const Recall at = evaluate(
            m, [&] { return std::make_unique<AssociativeRecallTask>(at_distance(d), batch, final_seed); }, d,
            cfg.eval.final_iters);
        e.fields.emplace_back("recall_d" + std::to_string(d), at.accuracy);
      }
    return e;
  };
  std::unique_ptr<Trainer> trainer =
      resume ? Trainer::resume(out, std::move(task), [&](TrainConfig& saved) { adopt_resume_config(saved, cfg, out); })
             : std::make_unique<Trainer>(cfg, out, std::move(task));
  const TrainResult result = trainer->run();
  const LanguageModel& model = trainer->model();
  const double loss = result.train_loss, seconds = result.train_seconds;
  const double chance = 1.0 / static_cast<double>(associative ? assoc_cfg.values : key_cfg.keys);
  std::string local;
  if (associative) local = ", \"local_recall\": " + json_number(result.val_fields.at(1).second);
  for (size_t i = 2; i < result.val_fields.size(); ++i)  // recall_dN
    local += ", \"" + result.val_fields[i].first + "\": " + json_number(result.val_fields[i].second);
  std::printf("{\"steps\": %lld, \"train_loss\": %s, \"val_loss\": %s, \"recall\": %s%s, \"chance\": %s, "
              "\"distance\": %lld, \"max_distance\": %lld, \"mem_len\": %lld, \"xmem_len\": %lld, \"layers\": %lld, "
              "\"train_seconds\": %.3f}\n",
              static_cast<long long>(cfg.train.max_iters), json_number(loss).c_str(), json_number(result.val_loss).c_str(),
              json_number(result.val_fields.at(0).second).c_str(), local.c_str(), json_number(chance).c_str(),
              static_cast<long long>(distance), static_cast<long long>(max_distance), static_cast<long long>(model.memory_use().mem_len),
              static_cast<long long>(cfg.model.option_int("xmem_len")), static_cast<long long>(cfg.model.n_layer), seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("recall_task", run, argc, argv); }
