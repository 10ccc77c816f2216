// E2c (docs/math.md#experiments; "Transformers are RNNs" §4.2-4.3): time per generated token
// at growing context, for linear attention's recurrent form (running sums),
// softmax attention with a KV cache, and softmax attention recomputing its
// whole window for every token (no cache).
//
//   build/bench/generation_speed --mode linear --out out/e2c/linear [--contexts 128,256,...,4096]
//
// The model is the char-LM recipe's shape (4 layers, 4 heads, width 128,
// vocab 65) with RoPE positions, so no table limits the context, randomly
// initialised (the time per token does not depend on the weights). For each
// context c: the state reads c - 1 prompt tokens, then --tokens tokens are fed
// one at a time (cache modes: one position each; recompute: a forward of the
// last c tokens each), and the median time per token is reported. Writes
// OUT/metrics.jsonl, a line per context, and prints one JSON line with the
// time at context 1024 and the ratio of the slowest to the fastest context
// (1 = flat in t).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/layers/transformer.h"
#include "tapeformer/train/metrics.h"

using namespace tapeformer;

namespace {

int run(int argc, char** argv) {
  CLI::App app{"E2c: milliseconds per generated token against context length"};
  std::string mode = "linear", out, contexts_text = "128,256,512,1024,2048,4096";
  int64_t tokens = 32;
  app.add_option("--mode", mode, "linear | softmax-cache | softmax-recompute")->capture_default_str();
  app.add_option("--out", out, "directory for metrics.jsonl (none: stdout only)");
  app.add_option("--contexts", contexts_text, "comma-separated context lengths")->capture_default_str();
  number_option(&app, "--tokens", tokens, "tokens timed per context (median)")->capture_default_str();
  check_number_options(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  TAPEFORMER_CHECK(mode == "linear" || mode == "softmax-cache" || mode == "softmax-recompute",
                   "generation_speed: --mode must be linear, softmax-cache or softmax-recompute, got ", mode);
  const std::vector<int64_t> contexts = bench::parse_list(contexts_text, "--contexts");
  TAPEFORMER_CHECK(!contexts.empty() && tokens >= 1, "generation_speed: need contexts and --tokens >= 1");

  ModelConfig cfg;  // the char-LM recipe's shape
  cfg.vocab_size = 65;
  cfg.attention = mode == "linear" ? "linear" : "softmax";
  cfg.positional = "rope";
  Rng rng(1);
  TransformerLM model(cfg, rng);
  model.eval();
  NoGradGuard no_grad;
  Rng unused(0);
  bench::MetricsFile metrics(out, "generation_speed");
  std::vector<std::pair<int64_t, double>> results;
  for (const int64_t c : contexts) {
    std::vector<int32_t> text(static_cast<size_t>(c + tokens));
    for (auto& id : text) id = static_cast<int32_t>(rng.below(65));
    std::vector<double> ms;
    if (mode == "softmax-recompute") {
      for (int64_t i = 0; i < tokens; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        model.forward(IndexTensor({1, c}, std::vector<int32_t>(text.begin() + i, text.begin() + i + c)), unused);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    } else {
      auto state = model.make_state(1, /*window=*/-1);  // the whole text stays visible
      model.forward(IndexTensor({1, c - 1}, std::vector<int32_t>(text.begin(), text.begin() + c - 1)), *state);
      for (int64_t i = 0; i < tokens; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        model.forward(IndexTensor({1, 1}, {text[static_cast<size_t>(c - 1 + i)]}), *state);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    results.emplace_back(c, median);
    char line[256];
    std::snprintf(line, sizeof line, "{\"context\": %lld, \"ms_per_token\": %.5f, \"tokens_per_s\": %.1f}",
                  static_cast<long long>(c), median, 1e3 / median);
    metrics.write(line);
  }
  double at_1024 = std::nan(""), lo = INFINITY, hi = 0;
  for (const auto& [c, t] : results) {
    if (c == 1024) at_1024 = t;
    lo = std::min(lo, t);
    hi = std::max(hi, t);
  }
  std::printf("{\"mode\": \"%s\", \"ms_per_token_at_1024\": %s, \"slowest_over_fastest\": %s, \"threads\": %d}\n",
              mode.c_str(), json_number(at_1024, 5).c_str(), json_number(hi / lo, 4).c_str(), parallel::num_threads());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("generation_speed", run, argc, argv); }
