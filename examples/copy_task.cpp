// E2a, the copy task of "Transformers are RNNs" (Katharopoulos et al. 2020
// §4.1.1, scaled down as docs/math.md#experiments says): learn to repeat `w` after `w SEP`,
// with any attention kind, feature map and positional scheme; --reverse
// asks for `w SEP reverse(w)` instead (the Universal Transformer's reversal task).
//
//   build/examples/copy_task --config configs/e2a_copy.json --out out/e2a/linear
//       --set model.attention=linear [--set model.feature_map=cos] [--max-len 32] [--symbols 10]
//   build/examples/copy_task --config ... --out out/e2a/linear --resume   (same task flags)
//
// The config is a training config (configs/*.json): model.*, optimizer.*,
// schedule.*, train.*, eval.*, log.* and checkpoint.* are used; data.* is
// not (the data is generated from train.seed). model.block_size must be
// 2 * max-len. The library's Trainer runs it on the task (TaskData):
// OUT/metrics.jsonl gets "accuracy" and "seq_accuracy" on evaluation steps,
// OUT/checkpoint.bin resumes it, SIGINT saves and stops. Prints one JSON line
// with the final figures. Accuracy counts the argmax predictions of the
// second copy's symbols; seq_accuracy the sequences whose every symbol is
// right. For stability sweeps (E5a), --target-loss reports the first
// evaluation step at or below a val loss and --divergence-ok ends a diverging
// run with "diverged": 1 instead of an error. "ponder_steps" is the mean
// number of block applications per position in the final evaluation: the
// ACT steps of a Universal Transformer (model.block universal), n_layer for
// any other stack.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/numbers.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/data/tasks.h"
#include "tapeformer/layers/attention/lsh.h"
#include "tapeformer/layers/block/universal.h"
#include "tapeformer/train/config.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/trainer.h"

using namespace tapeformer;

namespace {

struct Accuracy {
  double loss = 0, tokens = 0, sequences = 0;  // mean loss, fraction of symbols right, of sequences right
  double ponder = 0;                           // mean block applications per position
};

// Loss and argmax accuracy over the counted targets of `batches`.
Accuracy evaluate(LanguageModel& model, const std::vector<Batch>& batches) {
  model.eval();
  NoGradGuard no_grad;
  Rng unused(0);
  double loss = 0, steps = 0, positions = 0;
  int64_t right = 0, counted = 0, seq_right = 0, seqs = 0;
  for (const Batch& b : batches) {
    const Var logits = model.forward(b.inputs, unused);  // (B, T, V)
    bool universal = false;
    model.visit([&](Module& m) {
      if (auto* ut = dynamic_cast<UniversalStack*>(&m)) {
        steps += ut->last_ponder().steps;
        universal = true;
      }
    });
    positions += static_cast<double>(b.inputs.numel());
    if (!universal) steps += static_cast<double>(model.config().n_layer * b.inputs.numel());
    loss += cross_entropy(logits, b.targets).item();
    const int64_t B = b.inputs.shape[0], T = b.inputs.shape[1], V = logits.dim(2);
    const Scalar* z = logits.value().data();
    for (int64_t r = 0; r < B; ++r) {
      bool all = true;
      for (int64_t t = 0; t < T; ++t) {
        const int32_t want = b.targets.data[static_cast<size_t>(r * T + t)];
        if (want == kIgnoreTarget) continue;
        const Scalar* row = z + (r * T + t) * V;
        const bool ok = std::max_element(row, row + V) - row == want;
        right += ok;
        all = all && ok;
        ++counted;
      }
      seq_right += all;
      ++seqs;
    }
  }
  model.train();
  return {loss / static_cast<double>(batches.size()), static_cast<double>(right) / static_cast<double>(counted),
          static_cast<double>(seq_right) / static_cast<double>(seqs), steps / positions};
}

int run(int argc, char** argv) {
  CLI::App app{"E2a: the copy task with any attention kind (writes OUT/metrics.jsonl)"};
  std::string config_path, out = "out/copy_task";
  std::vector<std::string> overrides;
  CopyTaskConfig task_cfg;
  app.add_option("--config", config_path, "training config (model, optimizer, schedule, train, eval)")->required();
  app.add_option("--out", out, "output directory")->capture_default_str();
  app.add_option("--set", overrides, "override a config value (repeatable)");
  number_option(&app, "--symbols", task_cfg.symbols, "distinct symbols")->capture_default_str();
  number_option(&app, "--min-len", task_cfg.min_len, "shortest w")->capture_default_str();
  number_option(&app, "--max-len", task_cfg.max_len, "longest w (model.block_size must be twice it)")
      ->capture_default_str();
  app.add_flag("--reverse", task_cfg.reverse, "the reversal task: w SEP reverse(w)");
  double target_loss = 0;
  bool divergence_ok = false;
  std::string lsh_eval;
  int64_t lsh_eval_chunk = 0;
  number_option(&app, "--lsh-eval-chunk", lsh_eval_chunk,
                "E3d: the chunk the --lsh-eval rounds use (0: as trained; a model trained with one chunk needs one)")
      ->capture_default_str();
  app.add_option("--lsh-eval", lsh_eval,
                 "E3d: after training, evaluate again with each LSH layer set to these hashing rounds, comma-separated, "
                 "\"full\" for one chunk (full shared-QK attention); adds \"lsh_eval\": {...} to the result");
  number_option(&app, "--target-loss", target_loss,
                "report the first evaluation step whose val loss is at most this (0: off)")
      ->capture_default_str();
  app.add_flag("--divergence-ok", divergence_ok,
               "a non-finite loss ends the run with \"diverged\": 1 in its result instead of an error (sweeps)");
  bool resume = false;
  app.add_flag("--resume", resume, "continue the run saved in OUT (give the same task flags and --set values)");
  check_number_options(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // --lsh-eval's items, read now so that a bad one fails before training rather than after it: "full", or
  // hashing rounds >= 1.
  std::vector<std::pair<std::string, int64_t>> lsh_rounds;  // (item, rounds; 0 for "full")
  for (size_t at = 0; at < lsh_eval.size();) {
    const size_t end = std::min(lsh_eval.find(',', at), lsh_eval.size());
    const std::string v = lsh_eval.substr(at, end - at);
    at = end + 1;
    const int64_t rounds = v == "full" ? 0 : parse_number<int64_t>(v, "--lsh-eval");
    TAPEFORMER_CHECK(v == "full" || rounds >= 1, "--lsh-eval: hashing rounds must be >= 1 (or full), got ", v);
    lsh_rounds.push_back({v, rounds});
  }

  const TrainConfig cfg = TrainConfig::load(config_path, overrides);
  // Random streams from train.seed (train/streams.h): the Trainer's weights, and the task's batches,
  // evaluation batches and dropout.
  const int64_t seed = cfg.train.seed;
  auto train_task = std::make_unique<CopyTask>(task_cfg, cfg.train.batch_size, stream_seed(seed, TaskStream::batches));
  CopyTask val_task(task_cfg, cfg.train.batch_size, stream_seed(seed, TaskStream::evaluation));
  TAPEFORMER_CHECK(cfg.model.block_size == train_task->sequence_length(), "copy_task: model.block_size (",
                   cfg.model.block_size, ") must be 2 * --max-len = ", train_task->sequence_length(),
                   " (add --set model.block_size=", train_task->sequence_length(), ")");
  std::vector<Batch> val, final_val;
  for (int64_t i = 0; i < cfg.eval.iters; ++i) val.push_back(val_task.next());
  for (int64_t i = 0; i < cfg.eval.final_iters; ++i) final_val.push_back(val_task.next());

  TaskData task;
  task.name = "copy_task";
  task.vocab_size = train_task->vocab_size();
  task.batches = std::move(train_task);
  task.dropout_seed = stream_seed(seed, TaskStream::dropout);
  task.evaluate = [&](LanguageModel& m, bool final) {
    const Accuracy acc = evaluate(m, final ? final_val : val);
    if (!final) std::fprintf(stderr, "copy accuracy %.4f\n", acc.tokens);
    return TaskEvaluation{acc.loss,
                          {{"accuracy", acc.tokens}, {"seq_accuracy", acc.sequences}, {"ponder_steps", acc.ponder}}};
  };
  std::unique_ptr<Trainer> trainer =
      resume ? Trainer::resume(out, std::move(task), [&](TrainConfig& saved) { adopt_resume_config(saved, cfg, out); })
             : std::make_unique<Trainer>(cfg, out, std::move(task));
  TrainResult result;
  bool diverged = false;
  try {
    result = trainer->run();
  } catch (const Diverged& e) {
    if (!divergence_ok) throw;
    std::fprintf(stderr, "%s\n", e.what());
    diverged = true;
    result.steps = e.step() - 1;
    result.train_seconds = e.train_seconds();
  }
  LanguageModel& model = trainer->model();
  int64_t steps_to_target = -1;  // the first evaluation step at or below --target-loss
  if (target_loss > 0) {
    for (const MetricsRecord& r : read_metrics(out + "/metrics.jsonl"))
      if (steps_to_target < 0 && r.val_loss && *r.val_loss <= target_loss) steps_to_target = r.step;
  }
  const int64_t steps_run = result.steps;
  const double seconds = result.train_seconds, loss = result.train_loss;
  const Accuracy fin = diverged ? Accuracy{NAN, NAN, NAN, NAN}
                                : Accuracy{result.val_loss, result.val_fields.at(0).second,
                                           result.val_fields.at(1).second, result.val_fields.at(2).second};
  const double tokens = static_cast<double>(steps_run * cfg.train.batch_size * cfg.model.block_size);
  std::string lsh_results;  // ", \"lsh_eval\": {\"1\": acc, ..., \"full\": acc}"
  if (!lsh_rounds.empty() && !diverged) {
    std::vector<std::pair<int64_t, int64_t>> trained;  // each LSH layer's (hashes, chunk)
    model.visit([&](Module& m) {
      if (auto* l = dynamic_cast<LSHAttention*>(&m)) trained.push_back({l->n_hashes, l->chunk});
    });
    TAPEFORMER_CHECK(!trained.empty(), "copy_task: --lsh-eval needs model.attention lsh");
    for (const std::pair<std::string, int64_t>& item : lsh_rounds) {
      const std::string& v = item.first;
      model.visit([&](Module& m) {
        if (auto* l = dynamic_cast<LSHAttention*>(&m)) {
          if (v == "full") {
            l->set_hashes(1);
            l->chunk = cfg.model.block_size;  // one chunk: every earlier key
          } else {
            l->set_hashes(item.second);
            if (lsh_eval_chunk > 0) l->chunk = lsh_eval_chunk;
          }
        }
      });
      lsh_results += std::string(lsh_results.empty() ? "" : ", ") + "\"" + v + "\": " +
                     json_number(evaluate(model, final_val).tokens);
      size_t i = 0;
      model.visit([&](Module& m) {  // back to the trained settings
        if (auto* l = dynamic_cast<LSHAttention*>(&m)) l->set_hashes(trained[i].first), l->chunk = trained[i++].second;
      });
    }
    lsh_results = ", \"lsh_eval\": {" + lsh_results + "}";
  }
  std::printf("{\"steps\": %lld, \"train_loss\": %s, \"val_loss\": %s, \"accuracy\": %s, \"seq_accuracy\": %s, "
              "\"train_seconds\": %.3f, \"tokens_per_s\": %.1f, \"params\": %lld, \"diverged\": %d, "
              "\"reached_target\": %s, \"steps_to_target\": %s, \"ponder_steps\": %s, \"max_len\": %lld%s}\n",
              static_cast<long long>(steps_run), json_number(diverged ? NAN : loss).c_str(),
              json_number(fin.loss).c_str(), json_number(fin.tokens).c_str(), json_number(fin.sequences).c_str(),
              seconds, seconds > 0 ? tokens / seconds : 0.0, static_cast<long long>(model.num_parameters()),
              diverged ? 1 : 0, target_loss > 0 ? (steps_to_target > 0 ? "1" : "0") : "null",
              steps_to_target > 0 ? std::to_string(steps_to_target).c_str() : "null", json_number(fin.ponder).c_str(),
              static_cast<long long>(task_cfg.max_len), lsh_results.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("copy_task", run, argc, argv); }
