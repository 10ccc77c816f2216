#include "tapeformer/train/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/models/early_exit.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/commands.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/run_directory.h"
#include "tapeformer/train/windows.h"

namespace tapeformer {
namespace fs = std::filesystem;

namespace calibration {

const std::vector<double>& grid() {
  static const std::vector<double> lambdas = {1.0,  0.9999, 0.9995, 0.999, 0.998, 0.995, 0.99, 0.98, 0.97, 0.95, 0.93,
                                              0.9,  0.85,   0.8,    0.75,  0.7,   0.6,   0.5,  0.4,  0.3,  0.2,  0.1, 0.0};
  return lambdas;
}

double hoeffding_p(double r, int64_t n, double delta) {
  const double a = std::min(r, delta), b = delta;
  if (a >= b) return 1.0;
  const double h = (a > 0 ? a * std::log(a / b) : 0.0) + (1 - a) * std::log((1 - a) / (1 - b));
  return std::exp(-static_cast<double>(n) * h);
}

double bentkus_p(double r, int64_t n, double delta) {
  const auto k = static_cast<int64_t>(std::ceil(static_cast<double>(n) * r - 1e-9));
  if (k >= n) return 1.0;
  // P(Binomial(n, delta) <= k), summed in log space.
  double cdf = 0;
  for (int64_t i = 0; i <= k; ++i) {
    const double log_term = std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(i) + 1) -
                            std::lgamma(static_cast<double>(n - i) + 1) + static_cast<double>(i) * std::log(delta) +
                            static_cast<double>(n - i) * std::log1p(-delta);
    cdf += std::exp(log_term);
  }
  return std::min(1.0, std::exp(1.0) * cdf);
}

double hoeffding_bentkus_p(double r, int64_t n, double delta) {
  return std::min(hoeffding_p(r, n, delta), bentkus_p(r, n, delta));
}

int64_t fixed_sequence(const std::vector<double>& risks, int64_t n, double delta, double epsilon) {
  int64_t chosen = -1;
  for (size_t i = 0; i < risks.size(); ++i) {
    if (hoeffding_bentkus_p(risks[i], n, delta) > epsilon) break;
    chosen = static_cast<int64_t>(i);
  }
  return chosen;
}

int64_t grid_search(const std::vector<double>& risks, double delta) {
  int64_t chosen = -1;
  for (size_t i = 0; i < risks.size(); ++i)
    if (risks[i] <= delta) chosen = static_cast<int64_t>(i);
  return chosen;
}

}  // namespace calibration

namespace {

// Each window's figures when read with exits at one threshold.
struct Reading {
  std::vector<double> gap, loss, layers;  // per window: share of argmaxes unlike the full model's, mean CE, mean exit layer
};

// The model read over every window (B at a time), with its current threshold.
// full: the full model's argmaxes (empty: this is the full reading; they are filled).
Reading read_windows(EarlyExitLM& model, const std::vector<int32_t>& ids, int64_t n, int64_t T,
                     std::vector<int32_t>& full) {
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
      std::copy_n(ids.begin() + (w0 + i) * T, T, x.begin() + i * T);
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
        const int32_t next = ids[static_cast<size_t>((w0 + i) * T + t + 1)];
        loss += std::log(sum) + z[top] - z[next];
        layers += exited ? exits.data[static_cast<size_t>(i * T + t)] : static_cast<double>(model.config().n_layer);
      }
      r.gap.push_back(differ / static_cast<double>(T));
      r.loss.push_back(loss / static_cast<double>(T));
      r.layers.push_back(layers / static_cast<double>(T));
    }
  }
  return r;
}

double mean_over(const std::vector<double>& v, const std::vector<int64_t>& which) {
  double s = 0;
  for (int64_t i : which) s += v[static_cast<size_t>(i)];
  return which.empty() ? NAN : s / static_cast<double>(which.size());
}

}  // namespace

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
  const EvalText text = read_eval_text(data, *l.tokenizer, args.split, l.cfg.data.val_fraction);
  const int64_t T = l.cfg.model.block_size;
  int64_t n = (static_cast<int64_t>(text.ids.size()) - 1) / T;
  if (args.windows > 0) n = std::min(n, args.windows);
  TAPEFORMER_CHECK(n >= 20, "calibrate: '", data, "' (", args.split, " split) holds ", n, " windows of ", T,
                   " tokens; calibration and test need at least 20");

  // Every window at every threshold, and the full model.
  const double kept_threshold = model->threshold();
  const EarlyExitLM::Confidence kept_measure = model->measure();
  model->set_measure(measure);
  std::vector<int32_t> full;
  model->set_threshold(2);
  const Reading whole = read_windows(*model, text.ids, n, T, full);
  const std::vector<double> lambdas =
      args.method == "evaluate" ? std::vector<double>{args.threshold} : calibration::grid();
  std::vector<Reading> at;
  for (double lambda : lambdas) {
    model->set_threshold(lambda);
    at.push_back(read_windows(*model, text.ids, n, T, full));
  }
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

}  // namespace tapeformer
