// E2a, the copy task of "Transformers are RNNs" (Katharopoulos et al. 2020
// §4.1.1, scaled down as docs/math.md#experiments says): learn to repeat `w` after `w SEP`,
// with any attention kind, feature map and positional scheme.
//
//   build/examples/copy_task --config configs/e2a_copy.json --out out/e2a/linear
//       --set model.attention=linear [--set model.feature_map=cos] [--max-len 32] [--symbols 10]
//
// The config is a training config (configs/*.json): model.*, optimizer.*,
// schedule.*, train.* (batch_size, max_iters, seed, threads, shards),
// eval.interval / eval.iters / eval.final_iters and log.interval are used;
// data.* and checkpoint.* are not (the data is generated from train.seed,
// runs are short and not checkpointed). model.block_size must be 2 * max-len.
// Writes OUT/metrics.jsonl ({"step", "lr", "train_loss", "grad_norm",
// "elapsed_s"}, plus "val_loss", "accuracy" and "seq_accuracy" on evaluation
// steps) and prints one JSON line with the final figures. Accuracy counts
// the argmax predictions of the second copy's symbols; seq_accuracy the
// sequences whose every symbol is right. For stability sweeps (E5a),
// --target-loss reports the first evaluation step at or below a val loss and
// --divergence-ok ends a diverging run with "diverged": 1 instead of an
// error. Built on the library's own pieces:
// TransformerLM, make_optimizer / make_schedule / train_step, DataParallel.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/data/tasks.h"
#include "tapeformer/layers/attention/lsh.h"
#include "tapeformer/train/build.h"
#include "examples/task_loop.h"
#include "tapeformer/train/metrics.h"

using namespace tapeformer;

namespace {

struct Accuracy {
  double loss = 0, tokens = 0, sequences = 0;  // mean loss, fraction of symbols right, of sequences right
};

// Loss and argmax accuracy over the counted targets of `batches`.
Accuracy evaluate(TransformerLM& model, const std::vector<Batch>& batches) {
  model.eval();
  NoGradGuard no_grad;
  Rng unused(0);
  double loss = 0;
  int64_t right = 0, counted = 0, seq_right = 0, seqs = 0;
  for (const Batch& b : batches) {
    const Var logits = model.forward(b.inputs, unused);  // (B, T, V)
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
          static_cast<double>(seq_right) / static_cast<double>(seqs)};
}

int run(int argc, char** argv) {
  CLI::App app{"E2a: the copy task with any attention kind (writes OUT/metrics.jsonl)"};
  std::string config_path, out = "out/copy_task";
  std::vector<std::string> overrides;
  CopyTaskConfig task_cfg;
  app.add_option("--config", config_path, "training config (model, optimizer, schedule, train, eval)")->required();
  app.add_option("--out", out, "output directory")->capture_default_str();
  app.add_option("--set", overrides, "override a config value (repeatable)");
  app.add_option("--symbols", task_cfg.symbols, "distinct symbols")->capture_default_str();
  app.add_option("--min-len", task_cfg.min_len, "shortest w")->capture_default_str();
  app.add_option("--max-len", task_cfg.max_len, "longest w (model.block_size must be twice it)")->capture_default_str();
  double target_loss = 0;
  bool divergence_ok = false;
  std::string lsh_eval;
  int64_t lsh_eval_chunk = 0;
  app.add_option("--lsh-eval-chunk", lsh_eval_chunk,
                 "E3d: the chunk the --lsh-eval rounds use (0: as trained; a model trained with one chunk needs one)")
      ->capture_default_str();
  app.add_option("--lsh-eval", lsh_eval,
                 "E3d: after training, evaluate again with each LSH layer set to these hashing rounds, comma-separated, "
                 "\"full\" for one chunk (full shared-QK attention); adds \"lsh_eval\": {...} to the result");
  app.add_option("--target-loss", target_loss, "report the first evaluation step whose val loss is at most this (0: off)")
      ->capture_default_str();
  app.add_flag("--divergence-ok", divergence_ok,
               "a non-finite loss ends the run with \"diverged\": 1 in its result instead of an error (sweeps)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  const TrainConfig cfg0 = TrainConfig::load(config_path, overrides);
  TrainConfig cfg = cfg0;
  parallel::set_num_threads(static_cast<int>(cfg.train.threads));
  // Three streams from the seed: weights, training batches, evaluation batches.
  const auto seed = static_cast<uint64_t>(cfg.train.seed);
  CopyTask train_task(task_cfg, cfg.train.batch_size, seed * 1000003ULL + 1);
  CopyTask val_task(task_cfg, cfg.train.batch_size, seed * 1000003ULL + 2);
  TAPEFORMER_CHECK(cfg.model.block_size == train_task.sequence_length(), "copy_task: model.block_size (",
                   cfg.model.block_size, ") must be 2 * --max-len = ", train_task.sequence_length(),
                   " (add --set model.block_size=", train_task.sequence_length(), ")");
  cfg.model.vocab_size = train_task.vocab_size();
  std::vector<Batch> val, final_val;
  for (int64_t i = 0; i < cfg.eval.iters; ++i) val.push_back(val_task.next());
  for (int64_t i = 0; i < cfg.eval.final_iters; ++i) final_val.push_back(val_task.next());

  TaskLoop loop(cfg, out, "copy_task", seed * 1000003ULL);
  TransformerLM& model = *loop.model;
  int64_t steps_to_target = -1;
  const TaskLoop::Result result = loop.run(
      [&] { return train_task.next(); },
      [&](int64_t step, MetricsRecord& m) {
        const Accuracy acc = evaluate(model, val);
        if (target_loss > 0 && steps_to_target < 0 && acc.loss <= target_loss) steps_to_target = step;
        std::fprintf(stderr, "step %lld: val loss %.4f, copy accuracy %.4f\n", static_cast<long long>(step), acc.loss,
                     acc.tokens);
        m.val_loss = acc.loss;
        m.extra = {{"accuracy", acc.tokens}, {"seq_accuracy", acc.sequences}};
      },
      nullptr, divergence_ok);
  const bool diverged = result.diverged;
  const int64_t steps_run = result.steps;
  const double seconds = result.seconds, loss = result.train_loss;
  const Accuracy fin = diverged ? Accuracy{NAN, NAN, NAN} : evaluate(model, final_val);
  const double tokens = static_cast<double>(steps_run * cfg.train.batch_size * cfg.model.block_size);
  std::string lsh_results;  // ", \"lsh_eval\": {\"1\": acc, ..., \"full\": acc}"
  if (!lsh_eval.empty() && !diverged) {
    std::vector<std::pair<int64_t, int64_t>> trained;  // each LSH layer's (hashes, chunk)
    model.visit([&](Module& m) {
      if (auto* l = dynamic_cast<LSHAttention*>(&m)) trained.push_back({l->n_hashes, l->chunk});
    });
    TAPEFORMER_CHECK(!trained.empty(), "copy_task: --lsh-eval needs model.attention lsh");
    for (size_t at = 0; at < lsh_eval.size();) {
      const size_t end = std::min(lsh_eval.find(',', at), lsh_eval.size());
      const std::string v = lsh_eval.substr(at, end - at);
      at = end + 1;
      model.visit([&](Module& m) {
        if (auto* l = dynamic_cast<LSHAttention*>(&m)) {
          if (v == "full") {
            l->set_hashes(1);
            l->chunk = cfg.model.block_size;  // one chunk: every earlier key
          } else {
            l->set_hashes(std::stoll(v));
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
              "\"reached_target\": %s, \"steps_to_target\": %s%s}\n",
              static_cast<long long>(steps_run), json_number(diverged ? NAN : loss).c_str(),
              json_number(fin.loss).c_str(), json_number(fin.tokens).c_str(), json_number(fin.sequences).c_str(),
              seconds, seconds > 0 ? tokens / seconds : 0.0, static_cast<long long>(model.num_parameters()),
              diverged ? 1 : 0, target_loss > 0 ? (steps_to_target > 0 ? "1" : "0") : "null",
              steps_to_target > 0 ? std::to_string(steps_to_target).c_str() : "null", lsh_results.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("copy_task", run, argc, argv); }
