// E3b (docs/math.md#experiments; Reformer Table 3): peak tensor memory and time of one
// training step (forward, loss, backward) against depth, for a block kind.
//
//   build/bench/block_memory --block reversible --out out/e3b/reversible [--ff-chunks 8] [--depths 2,4,8,12,16]
//
// The model: width 128, 4 heads, T = 512 (E3b's length), vocab 65, learned
// positions, softmax attention (at T = 512 the memory-lean kernel, which
// keeps O(T) per head), batch 4 of random tokens. For each depth: one
// warm-up step (so parameter gradients exist and later steps accumulate into
// them), then --repeats timed steps; the peak is the most tensor bytes alive
// during a step above those alive before it (activations, the backward's
// transients; parameters and their gradients excluded). Writes
// OUT/metrics.jsonl, a line per depth, and prints one JSON line with the peak
// at 12 layers over the peak at 2, and the time of a step at 12 layers.
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
#include "tapeformer/core/storage.h"
#include "tapeformer/layers/transformer.h"
#include "tapeformer/train/metrics.h"

using namespace tapeformer;

namespace {

IndexTensor random_ids(int64_t B, int64_t T, int64_t V, Rng& rng) {
  std::vector<int32_t> v(static_cast<size_t>(B * T));
  for (auto& x : v) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  return IndexTensor({B, T}, v);
}

struct Point {
  int64_t layers;
  double peak_bytes, ms_per_step;
};

int run(int argc, char** argv) {
  CLI::App app{"E3b: peak activation memory and step time against depth"};
  std::string block = "standard", out, depths_text = "2,4,8,12,16";
  int64_t ff_chunks = 1, T = 512, batch = 4, width = 128, repeats = 3;
  app.add_option("--block", block, "model.block: standard | reversible")->capture_default_str();
  number_option(&app, "--ff-chunks", ff_chunks, "model.ff_chunks (reversible only)")->capture_default_str();
  app.add_option("--depths", depths_text, "comma-separated layer counts")->capture_default_str();
  number_option(&app, "--seq", T, "sequence length T")->capture_default_str();
  number_option(&app, "--batch", batch, "sequences per step")->capture_default_str();
  number_option(&app, "--width", width, "model width C")->capture_default_str();
  number_option(&app, "--repeats", repeats, "timed steps per depth (median)")->capture_default_str();
  app.add_option("--out", out, "directory for metrics.jsonl (none: stdout only)");
  check_number_options(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const std::vector<int64_t> depths = bench::parse_list(depths_text, "--depths");
  TAPEFORMER_CHECK(!depths.empty() && repeats >= 1, "block_memory: need --depths and --repeats >= 1");
  bench::MetricsFile metrics(out, "block_memory");
  std::vector<Point> points;
  for (const int64_t L : depths) {
    ModelConfig c;
    c.vocab_size = 65;
    c.block_size = T;
    c.n_layer = L;
    c.n_head = 4;
    c.n_embd = width;
    c.block = block;
    if (ff_chunks != 1) c.options["ff_chunks"] = ff_chunks;
    Rng rng(1);
    TransformerLM model(c, rng);
    const IndexTensor x = random_ids(batch, T, c.vocab_size, rng), y = random_ids(batch, T, c.vocab_size, rng);
    const auto step = [&] { backward(cross_entropy(model.forward(x, rng), y)); };
    step();  // warm-up: gradients allocated, kernels' workspaces made
    Storage::release_cache();
    std::vector<double> ms;
    double peak = 0;
    for (int64_t r = 0; r < repeats; ++r) {
      const int64_t before = Storage::live_bytes();
      Storage::reset_peak();
      const auto t0 = std::chrono::steady_clock::now();
      step();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      peak = std::max(peak, static_cast<double>(Storage::peak_bytes() - before));
    }
    std::sort(ms.begin(), ms.end());
    const Point p{L, peak, ms[ms.size() / 2]};
    points.push_back(p);
    char line[256];
    std::snprintf(line, sizeof line, "{\"layers\": %lld, \"peak_mb\": %.3f, \"ms_per_step\": %.3f}",
                  static_cast<long long>(L), peak / 1e6, p.ms_per_step);
    metrics.write(line);
  }
  const auto at = [&](int64_t L, double Point::*field) {
    for (const Point& p : points)
      if (p.layers == L) return p.*field;
    return std::nan("");
  };
  const auto number = [](double v) { return json_number(v, 4); };
  std::printf("{\"block\": \"%s\", \"ff_chunks\": %lld, \"peak_mb_at_2\": %s, \"peak_mb_at_12\": %s, "
              "\"peak_12_over_2\": %s, \"ms_per_step_at_12\": %s, \"threads\": %d}\n",
              block.c_str(), static_cast<long long>(ff_chunks), number(at(2, &Point::peak_bytes) / 1e6).c_str(),
              number(at(12, &Point::peak_bytes) / 1e6).c_str(),
              number(at(12, &Point::peak_bytes) / at(2, &Point::peak_bytes)).c_str(),
              number(at(12, &Point::ms_per_step)).c_str(), parallel::num_threads());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("block_memory", run, argc, argv); }
