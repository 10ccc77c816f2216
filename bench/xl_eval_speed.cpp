// E4b (docs/math.md#experiments; Dai et al. 2019 Table 9): evaluation time per token of a
// Transformer-XL reading segments with a cached memory, against a vanilla
// model recomputing its whole window for every predicted token, at attention
// length L.
//
//   build/bench/xl_eval_speed --out out/e4b [--lengths 64,128,256,512]
//
// The model is the char-LM recipe's shape (4 layers, 4 heads, width 128,
// vocab 65) with txl positions, randomly initialised, one sequence. Cached:
// segments of L tokens, each attending to a memory of the previous L
// positions (model.mem_len = L), time of a segment / L. Recompute: a
// forward of the last L tokens for each predicted token (what a model
// without memory does to give every token L positions of context). Medians
// of --repeats calls. Writes OUT/metrics.jsonl, a line per L, and prints one
// JSON line with the speed-ups and the smallest speed-up / L.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "bench/bench_common.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/layers/transformer.h"
#include "tapeformer/train/metrics.h"

using namespace tapeformer;

namespace {

IndexTensor random_ids(int64_t T, Rng& rng) {
  std::vector<int32_t> v(static_cast<size_t>(T));
  for (auto& x : v) x = static_cast<int32_t>(rng.below(65));
  return IndexTensor({1, T}, v);
}

template <class F>
double median_ms(int64_t repeats, F&& f) {
  std::vector<double> ms;
  for (int64_t r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int run(int argc, char** argv) {
  CLI::App app{"E4b: Transformer-XL evaluation time per token, cached memory vs recomputed window"};
  std::string out, lengths_text = "64,128,256,512";
  int64_t repeats = 7;
  app.add_option("--out", out, "directory for metrics.jsonl (none: stdout only)");
  app.add_option("--lengths", lengths_text, "comma-separated attention lengths L")->capture_default_str();
  number_option(&app, "--repeats", repeats, "timed calls per L (median)")->capture_default_str();
  check_number_options(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const std::vector<int64_t> lengths = bench::parse_list(lengths_text, "--lengths");
  TAPEFORMER_CHECK(!lengths.empty() && repeats >= 1, "xl_eval_speed: need --lengths and --repeats >= 1");
  bench::MetricsFile metrics(out, "xl_eval_speed");
  std::string speedups;
  double worst = INFINITY;
  for (const int64_t L : lengths) {
    ModelConfig c;
    c.vocab_size = 65;
    c.block_size = L;
    c.positional = "txl";
    c.options["mem_len"] = L;
    Rng rng(1);
    TransformerLM model(c, rng);
    model.eval();
    NoGradGuard no_grad;
    SegmentMemory memory;
    model.forward(random_ids(L, rng), memory, rng);  // a full memory of L positions
    const IndexTensor segment = random_ids(L, rng);
    const double cached = median_ms(repeats, [&] {
      SegmentMemory m = memory;  // the same memory every call
      model.forward(segment, m, rng);
    }) / static_cast<double>(L);
    const double recompute = median_ms(repeats, [&] { model.forward(segment, rng); });  // one token's window
    const double speedup = recompute / cached;
    worst = std::min(worst, speedup / static_cast<double>(L));
    char line[256];
    std::snprintf(line, sizeof line,
                  "{\"L\": %lld, \"ms_per_token_cached\": %.5f, \"ms_per_token_recompute\": %.4f, \"speedup\": %.2f}",
                  static_cast<long long>(L), cached, recompute, speedup);
    metrics.write(line);
    speedups += "\"speedup_at_" + std::to_string(L) + "\": " + json_number(speedup, 4) + ", ";
  }
  std::printf("{%s\"min_speedup_over_L\": %s, \"threads\": %d}\n", speedups.c_str(), json_number(worst, 4).c_str(),
              parallel::num_threads());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("xl_eval_speed", run, argc, argv); }
