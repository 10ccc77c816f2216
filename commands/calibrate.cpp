// `tapeformer calibrate`: the exit threshold of an early-exit model
// (layers/models/early_exit.h) chosen on held-out text, written into its run.
//
//   tapeformer calibrate --checkpoint out/exit --delta 0.1 --epsilon 0.05   # one JSON line; the run gets it
//
// The held-out text (the run's val split by default) is cut into windows of
// block_size tokens (a run with data.align: its records), shuffled by a seed
// and halved: calibration and test. The readings' progress goes to stderr.
// For each threshold lambda of a fixed grid, from 1 (no exits in practice)
// down to 0, every window is read with exits, and its gap to the full model
// is D(lambda) in [0, 1]: the share of its positions whose most likely next
// token differs from the full model's (CALM's token-level consistency).
//
//   grid (depth-adaptive, Elbayad et al. 2020): the smallest lambda whose
//        mean gap on the calibration windows is at most delta;
//   ltt  (CALM's Learn-then-Test, Schuster et al. 2022; Angelopoulos et al.
//        2021): lambdas are tested in order from the most conservative; each
//        gets the Hoeffding-Bentkus p-value of "mean gap > delta" over the n
//        calibration windows, and the last one before the first p-value
//        above epsilon is chosen (none: exits stay off). With probability at
//        least 1 - epsilon over the calibration windows, the chosen lambda's
//        expected gap on windows from the same text is at most delta.
//   evaluate: the given --threshold only (nothing is chosen or written).
//
// The guarantee is checked by repeating the choice on `splits` random
// halvings and counting those whose test half's mean gap exceeds delta: for
// ltt that share should stay below epsilon. The run's checkpoint (under its
// run lock) gets the chosen threshold and measure; `sample` and `eval` then
// exit with them (train/calibration.h holds the statistics).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "tapeformer/autograd/tape.h"
#include "tapeformer/commands/command.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/models/early_exit.h"
#include "tapeformer/train/calibration.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/run_directory.h"
#include "tapeformer/train/windows.h"

namespace tapeformer {
namespace fs = std::filesystem;
namespace {

struct CalibrateArgs {
  std::string run;               // the run directory (its checkpoint.bin is rewritten)
  std::string data;              // held-out text; empty: the run's data.path
  std::string split = "val";     // all | train | val of that file (the run's data.val_fraction)
  std::string method = "ltt";    // ltt | grid | evaluate
  std::string confidence;        // max | margin | cosine; empty: the model's
  double delta = 0.1;            // tolerance on a window's gap
  double epsilon = 0.05;         // risk level (ltt)
  double threshold = 2;          // evaluate: the lambda to read with
  int64_t windows = 0;           // windows of the text to use (0: all)
  int64_t splits = 100;          // random halvings for the guarantee check
  uint64_t seed = 1;             // the halving written into the run, and the first of the checks
  std::string sweep;             // a file for one JSON line per lambda (threshold, gap, loss, layers_mean)
  bool dry_run = false;          // print, do not write the run
};




// Each window's figures when read with exits at one threshold.
struct Reading {
  std::vector<double> gap, loss, layers;  // per window: share of argmaxes unlike the full model's, mean CE, mean exit layer
};

// The model read over every window (B at a time), with its current threshold:
// window i is the T tokens from i * stride and the token after each.
// full: the full model's argmaxes (empty: this is the full reading; they are filled).
// progress counts the windows read (`done` so far, `at`: what is read).
Reading read_windows(EarlyExitLM& model, const std::vector<int32_t>& ids, int64_t n, int64_t T, int64_t stride,
                     std::vector<int32_t>& full, WorkProgress& progress, int64_t& done, const std::string& at) {
  const bool first = full.empty();
  if (first) full.assign(static_cast<size_t>(n * T), 0);
  Reading r;
  NoGradGuard no_grad;
  Rng unused(0);
  const int64_t B = 16;
  for (int64_t w0 = 0; w0 < n; w0 += B) {
    const int64_t b = std::min(B, n - w0);
    std::vector<int32_t> x(static_cast<size_t>(b * T));
    for (int64_t i = 0; i < b; ++i)
      std::copy_n(ids.begin() + (w0 + i) * stride, T, x.begin() + i * T);
    const Tensor logits = model.forward(IndexTensor({b, T}, x), unused).value().contiguous();  // (b, T, V)
    const IndexTensor& exits = model.last_exit_layers();
    const bool exited = exits.shape.rank() == 2 && exits.shape[0] == b;
    const int64_t V = logits.dim(2);
    for (int64_t i = 0; i < b; ++i) {
      double differ = 0, loss = 0, layers = 0;
      for (int64_t t = 0; t < T; ++t) {
        const Scalar* z = logits.data() + (i * T + t) * V;
        const auto top = static_cast<int32_t>(std::max_element(z, z + V) - z);
        int32_t& want = full[static_cast<size_t>((w0 + i) * T + t)];
        if (first) want = top;
        differ += top != want;
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(z[v]) - z[top]);
        const int32_t next = ids[static_cast<size_t>((w0 + i) * stride + t + 1)];
        loss += std::log(sum) + z[top] - z[next];
        layers += exited ? exits.data[static_cast<size_t>(i * T + t)] : static_cast<double>(model.config().n_layer);
      }
      r.gap.push_back(differ / static_cast<double>(T));
      r.loss.push_back(loss / static_cast<double>(T));
      r.layers.push_back(layers / static_cast<double>(T));
    }
    progress.update(done += b, at);
  }
  return r;
}

double mean_over(const std::vector<double>& v, const std::vector<int64_t>& which) {
  double s = 0;
  for (int64_t i : which) s += v[static_cast<size_t>(i)];
  return which.empty() ? NAN : s / static_cast<double>(which.size());
}

int run_calibrate(const CalibrateArgs& args) {
  TAPEFORMER_CHECK(args.method == "ltt" || args.method == "grid" || args.method == "evaluate",
                   "calibrate: --method must be ltt, grid or evaluate, got \"", args.method, "\"");
  TAPEFORMER_CHECK(args.delta > 0 && args.delta < 1, "calibrate: --delta must be in (0, 1), got ", args.delta);
  TAPEFORMER_CHECK(args.epsilon > 0 && args.epsilon < 1, "calibrate: --epsilon must be in (0, 1), got ", args.epsilon);
  TAPEFORMER_CHECK(args.splits >= 1, "calibrate: --splits must be >= 1, got ", args.splits);
  TAPEFORMER_CHECK(args.windows >= 0, "calibrate: --windows must be >= 0, got ", args.windows);
  TAPEFORMER_CHECK(fs::is_directory(args.run) && fs::exists(fs::path(args.run) / "checkpoint.bin"), "calibrate: '",
                   args.run, "' is not a run directory with a checkpoint.bin (calibrate writes the threshold into it)");
  if (!args.sweep.empty()) RunDirectory::check_output("calibrate", args.sweep, {args.run + "/checkpoint.bin"});
  ProgressScope progress("calibrate");  // the readings' progress on stderr
  const bool writes = !args.dry_run && args.method != "evaluate";
  RunDirectory dir(args.run, writes);
  dir.lock_existing();  // a training process still writing there is refused
  const std::string path = checkpoint_file(args.run);
  const Checkpoint saved = load_checkpoint(path);  // what calibrate rewrites, its threshold changed
  Loaded l = load_model(saved, path);
  auto* model = dynamic_cast<EarlyExitLM*>(l.model.get());
  TAPEFORMER_CHECK(model != nullptr, "calibrate: the run's model.arch is \"", l.cfg.model.arch,
                   "\", which has no exits (train one with model.arch early_exit)");
  const EarlyExitLM::Confidence measure =
      args.confidence.empty() ? model->measure() : EarlyExitLM::parse_confidence(args.confidence);
  const std::string data = args.data.empty() ? l.cfg.data.path : args.data;
  TAPEFORMER_CHECK(!data.empty(), "calibrate: the run names no data file; give the held-out text with --data");
  EvalText text = read_eval_text(data, *l.tokenizer, args.split, l.cfg.data.val_fraction);
  text.align = l.cfg.data.align;  // records of a fixed length: the windows the run trained on
  const int64_t T = l.cfg.model.block_size, size = static_cast<int64_t>(text.ids.size());
  // Windows of T tokens and the token after each, from every T-th token
  // (records: every data.align-th) while one fits.
  const int64_t stride = text.align > 1 ? text.align : T;
  int64_t n = whole_windows(size, T, stride);
  if (args.windows > 0) n = std::min(n, args.windows);
  TAPEFORMER_CHECK(n >= 20, "calibrate: '", data, "' (", args.split, " split) holds ", n, " windows of ", T,
                   " tokens; calibration and test need at least 20");

  // Every window at every threshold, and the full model.
  const double kept_threshold = model->threshold();
  const EarlyExitLM::Confidence kept_measure = model->measure();
  model->set_measure(measure);
  const std::vector<double> lambdas =
      args.method == "evaluate" ? std::vector<double>{args.threshold} : calibration::grid();
  const auto readings = static_cast<int64_t>(lambdas.size()) + 1;
  WorkProgress reading("reading " + grouped(n) + " windows of " + grouped(T) + " tokens of '" + data + "'" +
                           (args.split == "all" ? "" : " (" + args.split + " split)") + " " + grouped(readings) +
                           " times (the full model and " +
                           (lambdas.size() == 1 ? "threshold " + json_number(lambdas[0])
                                                : grouped(readings - 1) + " thresholds") +
                           "): " + grouped(n * readings) + " windows",
                       n * readings, "windows");
  int64_t done = 0;
  std::vector<int32_t> full;
  model->set_threshold(2);
  const Reading whole = read_windows(*model, text.ids, n, T, stride, full, reading, done, "the full model");
  std::vector<Reading> at;
  for (double lambda : lambdas) {
    model->set_threshold(lambda);
    at.push_back(read_windows(*model, text.ids, n, T, stride, full, reading, done, "threshold " + json_number(lambda)));
  }
  reading.done();
  model->reset_exit_counts();

  // A halving of the windows and the threshold chosen on its first half.
  const auto halve = [&](uint64_t seed) {
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    Rng rng(seed);
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(rng.below(static_cast<uint64_t>(i + 1)))]);
    const auto half = static_cast<std::ptrdiff_t>(n / 2);
    return std::make_pair(std::vector<int64_t>(order.begin(), order.begin() + half),
                          std::vector<int64_t>(order.begin() + half, order.end()));
  };
  const auto choose = [&](const std::vector<int64_t>& cal) -> int64_t {
    if (args.method == "evaluate") return 0;
    std::vector<double> risks;
    for (const Reading& r : at) risks.push_back(mean_over(r.gap, cal));
    return args.method == "grid" ? calibration::grid_search(risks, args.delta)
                                 : calibration::fixed_sequence(risks, static_cast<int64_t>(cal.size()), args.delta,
                                                               args.epsilon);
  };
  const auto [cal, test] = halve(args.seed);
  const int64_t chosen = choose(cal);
  int64_t violations = 0;
  for (int64_t k = 0; k < args.splits; ++k) {
    const auto [c, t] = halve(args.seed + static_cast<uint64_t>(k));
    const int64_t i = choose(c);
    const double gap = i < 0 ? 0.0 : mean_over(at[static_cast<size_t>(i)].gap, t);  // no exits: no gap
    violations += gap > args.delta;
  }

  if (!args.sweep.empty()) {
    std::ofstream out(args.sweep);
    TAPEFORMER_CHECK(out.good(), "calibrate: cannot write '", args.sweep, "'");
    for (size_t i = 0; i < lambdas.size(); ++i)
      out << "{\"threshold\": " << json_number(lambdas[i]) << ", \"calibration_gap\": "
          << json_number(mean_over(at[i].gap, cal)) << ", \"test_gap\": " << json_number(mean_over(at[i].gap, test))
          << ", \"loss\": " << json_number(mean_over(at[i].loss, test))
          << ", \"layers_mean\": " << json_number(mean_over(at[i].layers, test)) << "}\n";
    TAPEFORMER_CHECK(out.good(), "calibrate: writing '", args.sweep, "' failed");
  }

  const bool found = chosen >= 0;
  const double lambda = found ? lambdas[static_cast<size_t>(chosen)] : 2.0;  // none: exits stay off
  const Reading* r = found ? &at[static_cast<size_t>(chosen)] : &whole;
  if (writes) {
    model->set_threshold(lambda);
    Checkpoint c = saved;
    c.model = model->state();
    dir.save(c, c.step);
  } else {
    model->set_threshold(kept_threshold);
    model->set_measure(kept_measure);
  }
  std::printf("{\"method\": \"%s\", \"confidence\": \"%s\", \"delta\": %s, \"epsilon\": %s, \"threshold\": %s, "
              "\"calibration_windows\": %zu, \"test_windows\": %zu, \"calibration_gap\": %s, \"test_gap\": %s, "
              "\"test_loss\": %s, \"full_loss\": %s, \"test_layers_mean\": %s, \"layers\": %lld, \"splits\": %lld, "
              "\"violations\": %s, \"written\": %s}\n",
              args.method.c_str(), EarlyExitLM::confidence_name(measure), json_number(args.delta).c_str(),
              json_number(args.epsilon).c_str(), found ? json_number(lambda).c_str() : "null", cal.size(), test.size(),
              json_number(mean_over(r->gap, cal)).c_str(), json_number(mean_over(r->gap, test)).c_str(),
              json_number(mean_over(r->loss, test)).c_str(), json_number(mean_over(whole.loss, test)).c_str(),
              json_number(mean_over(r->layers, test)).c_str(), static_cast<long long>(l.cfg.model.n_layer),
              static_cast<long long>(args.splits),
              json_number(static_cast<double>(violations) / static_cast<double>(args.splits)).c_str(),
              writes ? "true" : "false");
  return 0;
}

}  // namespace

Command calibrate_command() {
  return {"calibrate",
          "choose an early-exit model's threshold on held-out text and write it into the run (Learn-then-Test or a "
          "grid search)",
          [](CLI::App& cb) -> CommandRunner {
            auto args = std::make_shared<CalibrateArgs>();
            cb.add_option("--checkpoint", args->run,
                          "run directory (its checkpoint.bin gets the threshold)")->required();
            cb.add_option("--data", args->data, "held-out text file (default: the run's data.path)");
            cb.add_option("--split", args->split,
                          "all | train | val: the part of the file (the run's data.val_fraction)")
                ->check(CLI::IsMember({"all", "train", "val"}))
                ->capture_default_str();
            cb.add_option("--method", args->method, "ltt (a guarantee) | grid (the smallest threshold within delta) | "
                                                          "evaluate (read with --threshold, write nothing)")
                ->check(CLI::IsMember({"ltt", "grid", "evaluate"}))
                ->capture_default_str();
            cb.add_option("--confidence", args->confidence, "max | margin | cosine (default: the model's)")
                ->check(CLI::IsMember({"max", "margin", "cosine"}));
            number_option(&cb, "--delta", args->delta, "tolerance: a window's share of tokens unlike the full model's",
                          open_fraction)
                ->capture_default_str();
            number_option(&cb, "--epsilon", args->epsilon, "ltt: the risk level", open_fraction)->capture_default_str();
            number_option(&cb, "--threshold", args->threshold,
                          "evaluate: the threshold to read with")->capture_default_str();
            number_option(&cb, "--windows", args->windows,
                          "windows of the text to use (0: all)", integer_up_to(kMaxCount))
                ->capture_default_str();
            number_option(&cb, "--splits", args->splits,
                          "random halvings checking the guarantee", integer_in(1, 1 << 20))
                ->capture_default_str();
            number_option(&cb, "--seed", args->seed,
                          "the halving into calibration and test windows")->capture_default_str();
            cb.add_option("--sweep", args->sweep,
                          "write one JSON line per threshold tried (gap, loss, mean layers used)");
            cb.add_flag("--dry-run", args->dry_run, "print the result without writing the run");
            return [args](const CommandContext&) { return run_calibrate(*args); };
          }};
}

}  // namespace tapeformer
